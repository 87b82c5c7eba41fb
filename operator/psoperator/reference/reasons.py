"""Every reason the operator itself can write, read from its source: for the test that the
troubleshooting page (docs/troubleshooting.md) explains each.

A reason is a CamelCase word in a job's condition, event or `status.lastFailure`, or in a condition
the operator writes on a queued job's Workload. The code writes each as a string literal, found here
where it is:

- the `reason` argument, by position (from the signature) or by keyword, of a call to a function or
  dataclass of the package (`Draft.condition`, `Event`, `RecoveryDecision`, `Failure`, ...), or the
  `reason=` keyword of any call (`kopf.event`, `kopf.warn`);
- returned by a function whose name ends in `reason`, alone or first in a tuple;
- a value of a dict named `..._REASONS`, or the default of its `.get`;
- an f-string `{...role...}Failed`: one reason per role (ChiefFailed, PsFailed, ...).

Reasons that come from elsewhere and are passed on (the kubelet's OOMKilled, Kueue's words) are not
the operator's to list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from psoperator.contract import Role

PACKAGE = Path(__file__).resolve().parents[1]
# Reasons the rules above cannot see: told as (reason, message) pairs in control/reconciler.py.
PAIRED = ("NameConflict", "ChildRejected")


def _parameters(node: ast.AST) -> list[str]:
    """The parameters of a function (self not counted), or the fields of a dataclass, in order."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
    if isinstance(node, ast.ClassDef):
        fields = [s.target for s in node.body if isinstance(s, ast.AnnAssign)]
        return [t.id for t in fields if isinstance(t, ast.Name)]
    return []


def _reason_positions(trees: list[ast.Module]) -> dict[str, set[int]]:
    """Function and dataclass name -> the position of its `reason` parameter."""
    positions: dict[str, set[int]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            names = _parameters(node)
            if "reason" in names and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                positions.setdefault(node.name, set()).add(names.index("reason"))
    return positions


def _text(node: ast.expr | None) -> list[str]:
    """The reasons an expression spells out."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple) and node.elts:
        return _text(node.elts[0])
    if isinstance(node, ast.JoinedStr) and len(node.values) == 2:
        value, suffix = node.values
        if "role" in ast.unparse(value) and isinstance(suffix, ast.Constant) and suffix.value == "Failed":
            return [f"{role.value.capitalize()}Failed" for role in Role]
    return []


def _called(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)


def _names_reasons(node: ast.Assign) -> bool:
    return any(isinstance(t, ast.Name) and t.id.endswith("_REASONS") for t in node.targets)


def _found(tree: ast.Module, positions: dict[str, set[int]]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "reason":
                    yield from _text(keyword.value)
            for position in positions.get(_called(node) or "", ()):
                if position < len(node.args):
                    yield from _text(node.args[position])
            if (
                _called(node) == "get"
                and ast.unparse(node.func).endswith("_REASONS.get")
                and len(node.args) > 1
            ):
                yield from _text(node.args[1])
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("reason"):
            for returned in ast.walk(node):
                if isinstance(returned, ast.Return):
                    yield from _text(returned.value)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and _names_reasons(node):
            for value in node.value.values:
                yield from _text(value)


def reasons_in_code(package: Path = PACKAGE) -> set[str]:
    """Every reason the package at `package` can write."""
    files = sorted(p for p in package.rglob("*.py") if p.relative_to(package).parts[0] != "reference")
    trees = [ast.parse(p.read_text(), str(p)) for p in files]
    positions = _reason_positions(trees)
    found = {reason for tree in trees for reason in _found(tree, positions)}
    return found | set(PAIRED)
