"""The `psoperator` command line, run in-process: render without a cluster, run's pass-through to kopf."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from psoperator.cli import CHIEF_KEY_FILE_ENV, kopf_options, main, parse_args

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


# The chart's arguments with extraArgs set to kopf's flags, as the Deployment runs them.
CHART_ARGS = [
    "run",
    "--all-namespaces",
    "--standalone",
    "--liveness=http://0.0.0.0:8080/healthz",
    "--verbose",
    "--log-format=json",
    "--peering",
    "ps-operators",
]


def test_run_hands_every_flag_it_does_not_know_to_kopf() -> None:
    args = parse_args([*CHART_ARGS, "--metrics-port", "9090", "--cluster-domain", "example.org"])
    assert (args.metrics_port, args.cluster_domain) == (9090, "example.org")
    options = kopf_options(args.kopf_args)
    assert options.logging["verbose"] is True
    assert options.logging["log_format"].name == "JSON"
    assert options.run["peering_name"] == "ps-operators"
    assert options.run["clusterwide"] is True and options.run["standalone"] is True
    assert options.run["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"


def test_run_with_the_e2e_suites_flags() -> None:
    args = parse_args(
        ["run", "--namespace", "team-a", "--standalone", "--liveness", "http://127.0.0.1:1/healthz"]
    )
    options = kopf_options(args.kopf_args)
    assert options.run["namespaces"] == ("team-a",) and not options.run["clusterwide"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--log-format=xml"], "--log-format"),
        (["run", "--no-such-flag"], "--no-such-flag"),
        (["run", "--namespace", "a", "--all-namespaces"], "not both"),
        (["run", "-m", "other.handlers"], "psoperator's own"),
    ],
)
def test_run_refuses_what_kopf_refuses_before_touching_a_cluster(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        kopf_options(parse_args(argv).kopf_args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_other_commands_still_refuse_unknown_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["render", "job.yaml", "--verbose"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --verbose" in capsys.readouterr().err


def test_the_real_command_accepts_the_charts_arguments(tmp_path: Path) -> None:
    """Started as the chart starts it, it gets past its command line to the missing cluster."""
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    env = {
        **os.environ,
        "KUBECONFIG": str(tmp_path / "absent"),
        "KUBERNETES_SERVICE_HOST": "",
        CHIEF_KEY_FILE_ENV: str(key),
    }
    done = subprocess.run(
        [sys.executable, "-m", "psoperator", *CHART_ARGS],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "usage:" not in done.stderr and "kube-config" in done.stderr


def test_the_operators_pod_labels_are_read_as_sorted_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    told = parse_args(["run", "--operator-pod-labels", "b=2, a=1"]).operator_pod_labels
    assert told == (("a", "1"), ("b", "2"))
    assert parse_args(["run", "--operator-pod-labels", ""]).operator_pod_labels == ()
    with pytest.raises(SystemExit):
        parse_args(["run", "--operator-pod-labels", "a=1,b"])
    assert "'a=1,b' is not name=value" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "--chief-key-file (or $PSOPERATOR_CHIEF_KEY_FILE) is required"),
        (b"", "cannot read the chief key"),
        (b"short\n", "the chief key has 6 bytes; at least 32 are needed"),
    ],
)
def test_run_needs_a_chief_key_before_touching_a_cluster(
    key: bytes | None,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    monkeypatch.delenv(CHIEF_KEY_FILE_ENV, raising=False)
    path = tmp_path / "key"
    if key:
        path.write_bytes(key)
    argv = ["run", "--namespace", "ns"] + ([] if key is None else ["--chief-key-file", str(path)])
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--resync-seconds", "--resyncs-per-second", "--fresh-reads-per-second"])
def test_a_resync_pace_must_be_above_zero(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert getattr(parse_args(["run", flag, "2.5"]), flag.lstrip("-").replace("-", "_")) == 2.5
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["run", flag, "0"])
    assert exit_info.value.code == 2
    assert "0 is not above zero" in capsys.readouterr().err
