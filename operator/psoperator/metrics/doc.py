"""docs/reference/metrics.md, generated from the metrics as the operator registers them (registry.py).

`psoperator metrics` prints it; `--write` writes it into the checkout this module is in. A unit test
fails when the committed file and the registry drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

from psoperator.metrics.registry import Metrics

DOC_FILE = Path("docs/reference/metrics.md")
INTRO = """\
# Metrics

<!-- Generated from operator/psoperator/metrics/registry.py by `psoperator metrics --write`; do not edit. -->

`psoperator run --metrics-port N` serves these at `:N/metrics` (the chart: port 9090, its Service
`<release>-metrics`, and a ServiceMonitor with `metrics.serviceMonitor.enabled`). A job is the
label `psjob`, not `job`, which Prometheus sets to the scrape job's name; scrape with
`honor_labels: true` (the chart's ServiceMonitor does) so that `namespace` stays the job's, not the
operator's. Every series labelled `psjob` goes away when the job is deleted; the counters labelled by
`namespace` only stay. No label holds a pod's name. Alerts and a Grafana dashboard built on these
ship in the chart (`metrics.prometheusRule.enabled`, `metrics.grafanaDashboard.enabled`).

| metric | type | labels | meaning |
|---|---|---|---|
"""


def render() -> str:
    rows = [
        f"| `{doc.name}` | {doc.type} | {', '.join(f'`{label}`' for label in doc.labels)} | {doc.help} |\n"
        for doc in Metrics().reference
    ]
    return INTRO + "".join(rows)


ROOT = Path(__file__).resolve().parents[3]  # the checkout this module is in


def main(*, write: bool) -> int:
    text = render()
    if not write:
        sys.stdout.write(text)
        return 0
    path = ROOT / DOC_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0
