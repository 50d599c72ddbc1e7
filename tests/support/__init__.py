"""Helpers the tests share (no test in here)."""
