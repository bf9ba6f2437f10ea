"""The demo's scripts (importable for their tests: `python -m examples.record_runs`)."""
