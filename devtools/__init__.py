"""Helpers for the tests, the benchmark and the examples, kept out of the wheel: a real server in
a subprocess and an nginx in front of replicas (testing.py), the seeded demo in Chromium
(demo.py). Imported from a checkout (pytest's pythonpath, `python -m benchmark...` from its root,
examples/ and docs/ scripts that put the checkout first on sys.path)."""
