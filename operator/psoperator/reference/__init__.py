"""The documentation's reference pages, generated from the code so that they cannot drift from it.

Each page is a pure `render() -> str` (api_fields.py, chart_values.py, commands.py, and the metrics in
metrics/doc.py); `python -m psoperator.reference` says which committed pages differ from what the
code renders, and `--write` writes them. A unit test fails when a committed page is stale.
reasons.py finds every condition and event reason the operator can set, for the test that the
troubleshooting page explains each.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout this package is in


def escape(text: str) -> str:
    """Prose for a Markdown table cell: no column break, no raw HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
