"""The contract module: progress reports from untrusted text, and the TF_CONFIG index fallback."""

from __future__ import annotations

import json

import pytest

from psoperator import contract
from psoperator.contract import ProgressReport
from psoperator.render import render_children
from tests.unit.builders import job


def test_progress_report_round_trips_and_rejects_garbage() -> None:
    report = ProgressReport(state="running", step=10, checkpoint_step=8, loss=0.5)
    assert ProgressReport.parse(report.to_json()) == report
    for garbage in (None, "", "{", "[]", '{"step": "x"}', b"\xff\xfe"):
        assert ProgressReport.parse(garbage) is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"step": 5, "checkpointStep": 4, "checkpointTime": 1733500000000}', "checkpointTime"),  # ms
        ('{"step": 5, "checkpointStep": 4, "checkpointTime": Infinity}', "checkpointTime"),
        ('{"step": 5, "checkpointStep": 4, "checkpointTime": NaN}', "checkpointTime"),
        ('{"step": 5, "checkpointStep": 4, "checkpointTime": -1}', "checkpointTime"),
        ('{"step": 100000000000000000000000000}', "step"),
        ('{"step": 5, "checkpointStep": 9223372036854775808}', "checkpointStep"),
        ('{"step": "many"}', "step"),
        ('{"step": 5, "state": 3}', "state"),
        ('{"step": 5, "checkpointStep": [4]}', "checkpointStep"),
        ('{"step": 5, "checkpointPath": "' + "p" * 5000 + '"}', "checkpointPath"),
    ],
)
def test_a_report_with_a_value_the_status_cannot_keep_is_rejected_naming_the_field(
    text: str, field: str
) -> None:
    """JSON accepts NaN and Infinity, and a chief may write milliseconds or a step past 64 bits:
    such a report is rejected, saying which field and what it held, never half used."""
    rejected = ProgressReport.read(text)
    assert isinstance(rejected, contract.RejectedReport), rejected
    assert rejected.reason.startswith(f"{field}: ") and len(rejected.reason) <= 512
    assert ProgressReport.parse(text) is None


def test_a_report_at_the_bounds_the_status_can_keep_is_accepted() -> None:
    text = json.dumps(
        {"step": contract.MAX_STEP, "checkpointStep": 0, "checkpointTime": contract.LATEST_UNIX_SECONDS}
    )
    report = ProgressReport.read(text)
    assert isinstance(report, ProgressReport) and report.step == contract.MAX_STEP
    assert ProgressReport.read('{"checkpointTime": 0}') == ProgressReport(checkpoint_time=0)


def test_text_that_is_no_json_object_is_no_report_not_a_rejected_one() -> None:
    """A plain image's failed chief has its log tail as termination message: no report at all."""
    for text in (None, "", "Traceback (most recent call last):\n  ...", "[1, 2]", b"\xff\xfe"):
        assert ProgressReport.read(text) is None


def test_termination_message_fits_the_kubelet_limit() -> None:
    long = ProgressReport(state="failed", step=1, message="x" * 10_000).to_json()
    assert len(long.encode()) <= contract.TERMINATION_MESSAGE_LIMIT


def _ps_tf_config_template() -> str:
    sts = next(
        m for m in render_children(job()) if m["kind"] == "StatefulSet" and m["metadata"]["name"] == "ctr-ps"
    )
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    value: str = next(e["value"] for e in env if e["name"] == contract.ENV_TF_CONFIG)
    return value


def test_index_from_the_pod_name_where_the_pod_index_label_is_missing() -> None:
    """Kubernetes < 1.28: the label is missing, the kubelet expands $(PSOP_TASK_INDEX) to ''."""
    expanded = _ps_tf_config_template().replace("$(PSOP_TASK_INDEX)", "")
    env = {contract.ENV_TF_CONFIG: expanded, contract.ENV_TASK_INDEX: "", contract.ENV_POD_NAME: "ctr-ps-1"}
    text = contract.tf_config_text(env)
    assert text is not None
    assert json.loads(text)["task"] == {"type": "ps", "index": 1}


def test_a_resolved_index_is_left_alone() -> None:
    expanded = _ps_tf_config_template().replace("$(PSOP_TASK_INDEX)", "0")
    env = {contract.ENV_TF_CONFIG: expanded, contract.ENV_TASK_INDEX: "0", contract.ENV_POD_NAME: "ctr-ps-1"}
    assert contract.tf_config_text(env) == expanded


def test_checkpoint_answer_round_trips_and_rejects_garbage() -> None:
    answer = contract.CheckpointAnswer(checkpoint_step=120, checkpoint_path="/ckpt/ckpt-120", saved=True)
    assert json.loads(answer.to_json()) == {
        "checkpointStep": 120,
        "checkpointPath": "/ckpt/ckpt-120",
        "saved": True,
    }
    assert contract.CheckpointAnswer.parse(answer.to_json()) == answer
    for garbage in (None, "", "{", "[]", '{"checkpointStep": -1}', b"\xff\xfe"):
        assert contract.CheckpointAnswer.parse(garbage) is None


def test_checkpoint_request_defaults_and_bounds() -> None:
    default = contract.CheckpointRequest()
    assert (default.deadline_seconds, default.hold_seconds) == (
        contract.DEFAULT_CHECKPOINT_DEADLINE_SECONDS,
        0,
    )
    assert (
        contract.CheckpointRequest.from_json_object({"deadlineSeconds": "5", "holdSeconds": 2}).hold_seconds
        == 2
    )
    for bad in (
        {"deadlineSeconds": 0},
        {"holdSeconds": -1},
        {"deadlineSeconds": "soon"},
        {"holdSeconds": 1e9},
    ):
        with pytest.raises(contract.Invalid):
            contract.CheckpointRequest.from_json_object(bad)


def test_a_checkpoint_answer_with_a_step_beyond_64_bits_is_garbled() -> None:
    # The step goes into status.lastPlannedStop: a larger one makes every status write fail.
    assert contract.CheckpointAnswer.parse(f'{{"checkpointStep": {2**63}, "saved": true}}') is None
    largest = contract.CheckpointAnswer.parse(f'{{"checkpointStep": {2**63 - 1}, "saved": true}}')
    assert largest is not None and largest.checkpoint_step == 2**63 - 1
