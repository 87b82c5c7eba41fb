"""The generated pages: where each is committed, and the function that renders it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from psoperator.metrics import doc as metrics_doc
from psoperator.reference import api_fields, chart_values, commands

PAGES: dict[Path, Callable[[], str]] = {
    api_fields.DOC_FILE: api_fields.render,
    chart_values.DOC_FILE: chart_values.render,
    commands.DOC_FILE: commands.render,
    metrics_doc.DOC_FILE: metrics_doc.render,
}
