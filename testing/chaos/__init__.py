"""The chaos campaign's harness (its cases are ``tests/chaos/``; docs/chaos.md):

``trial``            one fault case: a real cluster, its jobs, the fault, the verdict
``faults``           the fault injectors (the fault model of docs/chaos.md)
``invariants``       the safety checks, each a pure function of the evidence a cluster
                     leaves
``faketime_shared``  a command on a stepped clock whose state every user can reach
"""
