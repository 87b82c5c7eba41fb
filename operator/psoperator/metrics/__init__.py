"""The operator's Prometheus metrics: what they show of a job, computed purely (readings.py), the
registry that serves them (registry.py) and docs/reference/metrics.md generated from it (doc.py)."""
