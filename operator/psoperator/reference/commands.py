"""docs/reference/cli.md: the `psoperator` command, from its argparse parser (cli.build_parser).

Each subcommand gets its usage, its description, a row per argument (the flags, the default, the
help) and its epilog. The parser is built with no environment, so that a default read from one
(`--operator-namespace` from $POD_NAMESPACE) shows as the parser's own.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psoperator import cli
from psoperator.reference import escape

DOC_FILE = Path("docs/reference/cli.md")
WIDTH = 100  # of the usage lines, whatever the terminal

INTRO = """\
# CLI reference: `psoperator`

<!-- Generated from operator/psoperator/cli.py by `python -m psoperator.reference --write`. -->

`pip install images/trainer .` (pstrainer, which holds the contract, is not on PyPI; or the operator
image, whose entrypoint it is) installs the `psoperator` command.
`run` is what the chart's Deployment runs; `render`, `crd`, `metrics` and `plan` need no cluster.
"""


@contextmanager
def _no_environment() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.update(saved)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, "", [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{flags}`"
    metavar = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    )
    return f"`{flags} {metavar}`"


def _section(name: str, parser: argparse.ArgumentParser) -> str:
    rows = [
        f"| {_argument(a)} | {_default(a)} | {escape((a.help or '') % {'default': a.default})} |\n"
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
    ]
    parts = [f"\n## `psoperator {name}`\n\n"]
    if parser.description:
        parts.append(f"{escape(parser.description)}\n\n")
    parts.append(f"```text\n{_usage(parser)}\n```\n\n")
    parts.append("| argument | default | description |\n|---|---|---|\n" + "".join(rows))
    if parser.epilog:
        parts.append(f"\n{escape(parser.epilog)}\n")
    return "".join(parts)


def render() -> str:
    with _no_environment():
        parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summary = "".join(
        f"| [`{choice.dest}`](#psoperator-{choice.dest}) | {escape(choice.help or '')} |\n"
        for choice in subcommands._choices_actions
    )
    sections = "".join(_section(name, sub) for name, sub in subcommands.choices.items())
    return f"{INTRO}\n| command | what it does |\n|---|---|\n{summary}{sections}"
