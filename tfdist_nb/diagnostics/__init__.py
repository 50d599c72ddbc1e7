"""Detectors and checks: events and facts in, findings out. Pure: no I/O, no IPython."""
