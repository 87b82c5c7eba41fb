"""The test hook PSOPERATOR_FAULT: parsed strictly, off unless set."""

from __future__ import annotations

import pytest

from psoperator.cli import main
from psoperator.faults import FAULT_ENV, Fault, parse_faults


def test_no_fault_unless_set() -> None:
    assert parse_faults(None) == frozenset() and parse_faults("") == frozenset()


def test_faults_are_named_comma_separated() -> None:
    assert parse_faults(" exit-after-restart-status-write, ") == {Fault.EXIT_AFTER_RESTART_STATUS_WRITE}


def test_an_unknown_fault_is_refused_rather_than_ignored() -> None:
    """A misspelt fault would let a test pass without its crash ever happening."""
    with pytest.raises(ValueError, match="exit-after-status"):
        parse_faults("exit-after-status")


def test_run_refuses_an_unknown_fault_before_touching_a_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(FAULT_ENV, "crash-somewhere")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert main(["run", "--namespace", "ns"]) == 2
    assert "unknown fault crash-somewhere" in capsys.readouterr().err
