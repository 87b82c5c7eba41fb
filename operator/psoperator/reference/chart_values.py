"""docs/reference/helm-values.md: every value of the chart, from its values.yaml and its comments.

A value's description is the block of comment lines right above its key; the file's first comment
block, set apart by a blank line, introduces the page. A key that holds a mapping gets a row of its
own when it has a comment, and its keys get theirs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from psoperator.reference import ROOT, escape

CHART = Path("charts/ps-training-operator")
VALUES_FILE = CHART / "values.yaml"
DOC_FILE = Path("docs/reference/helm-values.md")


@dataclass(frozen=True)
class Value:
    path: str  # dotted, as `helm --set` spells it
    default: Any
    description: str
    group: bool = False  # a mapping with keys of its own, which have rows of their own


def _comment_above(lines: list[str], line: int) -> str:
    """The comment lines right above `line` (0-based), without their '#'."""
    block: list[str] = []
    while line > 0 and lines[line - 1].strip().startswith("#"):
        line -= 1
        block.insert(0, lines[line].strip().removeprefix("#").strip())
    return " ".join(block)


def _walk(node: yaml.MappingNode, prefix: str, lines: list[str], loaded: Any) -> list[Value]:
    values = []
    for key_node, value_node in node.value:
        key = str(key_node.value)
        path = f"{prefix}{key}"
        description = _comment_above(lines, key_node.start_mark.line)
        if isinstance(value_node, yaml.MappingNode) and value_node.value:
            if description:
                values.append(Value(path, None, description, group=True))
            values += _walk(value_node, f"{path}.", lines, loaded[key])
        else:
            values.append(Value(path, loaded[key], description))
    return values


def chart_values(text: str) -> list[Value]:
    """Every value of a values.yaml, in the file's order."""
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        raise ValueError("values.yaml must be a mapping")
    return _walk(root, "", text.splitlines(), yaml.safe_load(text))


def introduction(text: str) -> str:
    """The file's first comment block, when a blank line sets it apart from the first key's."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if not line.strip().startswith("#")), 0)
    if end == 0 or lines[end].strip():
        return ""
    return " ".join(line.strip().removeprefix("#").strip() for line in lines[:end])


def _default(value: Value) -> str:
    if value.group:
        return ""
    return f"`{json.dumps(value.default, separators=(', ', ': '))}`"


def render() -> str:
    text = (ROOT / VALUES_FILE).read_text()
    rows = "".join(f"| `{v.path}` | {_default(v)} | {escape(v.description)} |\n" for v in chart_values(text))
    return (
        "# Helm chart values\n\n"
        f"<!-- Generated from {VALUES_FILE} by `python -m psoperator.reference --write`. -->\n\n"
        f"{escape(introduction(text))}\n\n"
        f"Set them with `--set path=value` or `--values file.yaml` on `helm install` and `helm upgrade`.\n\n"
        "| value | default | description |\n|---|---|---|\n"
        f"{rows}"
    )
