"""Tests that need no service: they pass with nothing started."""
