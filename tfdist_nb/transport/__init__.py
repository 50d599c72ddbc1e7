"""Kernel channels turned into events; execute requests turned into futures."""
