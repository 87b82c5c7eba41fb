"""The `psoperator` command line, run in-process: render without a cluster, run's pass-through to kopf."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from psoperator.cli import main

# What a user writes when the defaults suit them: no failurePolicy, no port, no evaluator.
MINIMAL = """\
apiVersion: psoperator.io/v1alpha1
kind: PSTrainingJob
metadata: {name: small}
spec:
  image: trainer:1
  chief: {template: {spec: {containers: [{name: trainer}]}}}
  ps: {replicas: 1, template: {spec: {containers: [{name: trainer}]}}}
  worker: {replicas: 1, template: {spec: {containers: [{name: trainer}]}}}
  checkpoint: {dir: /ckpt}
"""


def _chief_job(output: str) -> dict[str, Any]:
    manifests = list(yaml.safe_load_all(output))
    job: dict[str, Any] = next(m for m in manifests if m["kind"] == "Job")
    return job


def test_render_a_job_that_leaves_the_failure_policy_at_its_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "small.yaml"
    manifest.write_text(MINIMAL)
    assert main(["render", str(manifest)]) == 0
    rules = _chief_job(capsys.readouterr().out)["spec"]["podFailurePolicy"]["rules"]
    codes = next(r["onExitCodes"]["values"] for r in rules if "onExitCodes" in r)
    assert codes == [1, 2]


def test_render_reads_standard_input_for_a_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(MINIMAL))
    assert main(["render", "-"]) == 0
    assert _chief_job(capsys.readouterr().out)["metadata"]["name"] == "small-chief"


def test_render_tf_config_of_a_minimal_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "small.yaml"
    manifest.write_text(MINIMAL)
    assert main(["render", str(manifest), "--tf-config"]) == 0
    pods = [line.split(":", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert pods == ["small-ps-0", "small-worker-0", "small-chief-0"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        ("spec: [unclosed", "not YAML"),
    ],
)
def test_render_a_file_it_cannot_read_is_a_one_line_error(
    tmp_path: Path, content: str | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["render", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"psoperator render: error: {path}: ")
    assert message in captured.err
