"""The chaos campaign's harness: trials, faults and invariants."""
