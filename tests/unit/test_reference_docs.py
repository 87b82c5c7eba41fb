"""The documentation cannot drift from the code: the generated reference pages are what the code
renders, they miss no field, value or flag, and the troubleshooting page explains every reason the
operator can write, every condition type and every phase."""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from psoperator import cli
from psoperator.api import crd, crd_rules
from psoperator.api.models import FailurePolicy
from psoperator.api.vocabulary import ConditionType, Phase
from psoperator.reference import ROOT, api_fields, chart_values, commands, reasons
from psoperator.reference.pages import PAGES

TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"


@pytest.mark.parametrize(("page", "render"), PAGES.items(), ids=[str(p) for p in PAGES])
def test_every_generated_page_is_what_the_code_renders(page: Path, render: Callable[[], str]) -> None:
    committed = (ROOT / page).read_text()
    assert committed == render(), f"{page} is stale: run `python -m psoperator.reference --write`"


def _object_fields(path: str, node: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(section path, field name) of every field of every object below `node`, upstream types aside."""
    if api_fields._upstream(node) is not None:
        return
    for name, child in node.get("properties", {}).items():
        yield path, name
        yield from _object_fields(f"{path}.{name}", child)
    if isinstance(node.get("items"), dict):
        yield from _object_fields(f"{path}[]", node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        yield from _object_fields(f"{path}.*", node["additionalProperties"])


def test_the_api_reference_has_a_row_for_every_field_of_the_crd() -> None:
    schema = crd.openapi_schema()["properties"]
    expected = {pair for part in ("spec", "status") for pair in _object_fields(part, schema[part])}
    documented = {(s.path, r.name.strip("`")) for s in api_fields.sections() for r in s.rows}
    assert expected - documented == set()
    assert len(expected) > 100  # the walk went all the way down


def test_the_api_reference_row_shows_the_models_default_bounds_and_rules() -> None:
    field = FailurePolicy.model_fields["max_restarts"]
    section = next(s for s in api_fields.sections() if s.path == "spec.failurePolicy")
    row = next(r for r in section.rows if r.name == f"`{field.alias}`")
    assert row.default == f"`{field.default}`"
    assert "0 to 10000" in row.description
    checkpoint = next(s for s in api_fields.sections() if s.path == "spec.checkpoint")
    rule = next(r for r in crd_rules.VALIDATIONS[("spec", "checkpoint", "dir")])
    assert rule.message in next(r for r in checkpoint.rows if r.name == "`dir`").description


def test_the_api_reference_links_each_object_to_its_own_section() -> None:
    ids = [api_fields.anchor(s.path) for s in api_fields.sections()]
    assert len(set(ids)) == len(ids)
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", api_fields.render()))
    assert links == set(ids[1:])  # every object but the job itself


def _leaves(node: Any, path: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{path}{key}.")
    else:
        yield path.rstrip(".")


def test_every_chart_value_has_a_row_and_a_description() -> None:
    text = (ROOT / chart_values.VALUES_FILE).read_text()
    values = chart_values.chart_values(text)
    rows = {v.path: v for v in values}
    for leaf in _leaves(yaml.safe_load(text)):
        assert leaf in rows, leaf
        described = [p for p in rows if leaf == p or leaf.startswith(f"{p}.") if rows[p].description]
        assert described, f"{leaf} (or a key above it) needs a comment in values.yaml"


def test_a_values_comment_is_the_block_right_above_its_key() -> None:
    text = textwrap.dedent("""\
        # The chart.
        # Its second line.

        # How many.
        replicas: 2
        image:
          # Where from.
          repository: x

          tag: ""
        # A group.
        group:
          key: {}
        """)
    assert chart_values.introduction(text) == "The chart. Its second line."
    assert chart_values.chart_values(text) == [
        chart_values.Value("replicas", 2, "How many."),
        chart_values.Value("image.repository", "x", "Where from."),
        chart_values.Value("image.tag", "", ""),
        chart_values.Value("group", None, "A group.", group=True),
        chart_values.Value("group.key", {}, ""),
    ]
    assert chart_values.introduction("# Not an intro.\nreplicas: 2\n") == ""


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_cli_reference_has_every_command_and_argument_each_with_help() -> None:
    text = commands.render()
    for name, parser in _subcommands().items():
        assert f"## `psoperator {name}`" in text
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"psoperator {name} {action.option_strings or action.dest} has no help"
            assert commands._argument(action) in text


def test_troubleshooting_explains_every_reason_the_operator_can_write() -> None:
    text = TROUBLESHOOTING.read_text()
    missing = sorted(r for r in reasons.reasons_in_code() if f"`{r}`" not in text)
    assert missing == [], f"docs/troubleshooting.md says nothing of {missing}"


def test_troubleshooting_has_a_section_for_every_condition_type_and_names_every_phase() -> None:
    text = TROUBLESHOOTING.read_text()
    assert [t for t in ConditionType if f"### `{t}`" not in text] == []
    assert [p for p in Phase if f"`{p}`" not in text] == []


def test_the_reason_finder_reads_each_way_the_code_writes_a_reason(tmp_path: Path) -> None:
    (tmp_path / "policy.py").write_text(
        textwrap.dedent("""\
            from dataclasses import dataclass

            @dataclass
            class Decision:
                action: str
                reason: str = ""

            def condition(type_, status, reason, message): ...

            DISRUPTION_REASONS = {"Eviction": "ByDictValue"}

            def _record_reason(failures):
                if failures:
                    return "ByReturn"
                return "ByReturnToo", "a message"

            def decide(d, role, kopf, job):
                condition("Running", True, "ByPosition", "...")
                condition("Running", True, reason="ByKeyword", message="...")
                Decision("fail", "ByDataclass")
                kopf.warn(job, reason="ByAnyKeyword", message="...")
                DISRUPTION_REASONS.get(role, "ByDefault")
                Decision("x", f"{role.value.capitalize()}Failed")
                condition("Running", True, some_variable, "not a literal")
                print("NotAReason")
            """)
    )
    assert reasons.reasons_in_code(tmp_path) == {
        "ByPosition",
        "ByKeyword",
        "ByDataclass",
        "ByAnyKeyword",
        "ByDictValue",
        "ByDefault",
        "ByReturn",
        "ByReturnToo",
        "ChiefFailed",
        "PsFailed",
        "WorkerFailed",
        "EvaluatorFailed",
        *reasons.PAIRED,
    }


def test_the_reason_finder_finds_what_a_user_sees_most() -> None:
    found = reasons.reasons_in_code()
    seen_most = {
        "Unschedulable",
        "StartupError",
        "PermanentExitCode",
        "RestartsExhausted",
        "ParameterServerLost",
        "SizingWarning",
        "Stalled",
        "NameConflict",
        "KueueNotInstalled",
        "ChildRejected",
        "NodeLost",
    }
    assert seen_most <= found
