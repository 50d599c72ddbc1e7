"""Telemetry and log store: the run directory on disk and DataFrame views of it."""
