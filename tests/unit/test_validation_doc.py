"""docs/reference/validation.md's catalogue table is the one e2e/bad_input.py generates."""

from __future__ import annotations

from e2e.bad_input import CATALOGUE, DOC, with_table


def test_the_documented_catalogue_is_the_tested_one() -> None:
    document = DOC.read_text()
    assert with_table(document) == document, "rerun `python -m e2e.bad_input --write` and review the diff"


def test_the_catalogue_holds_at_least_30_cases_with_unique_ids() -> None:
    ids = [case.id for case in CATALOGUE]
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids)
