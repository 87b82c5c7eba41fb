"""The runtime's pure parts: configuration, exit codes, cadence, progress. No TensorFlow process."""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tfcluster.jobs import ctr_job
from tfcluster.kubelet import job_pod, resolve_env, statefulset_pod

import pstrainer
from psoperator.contract import (
    DEFAULT_CHECKPOINT_DEADLINE_SECONDS,
    CheckpointAnswer,
    CheckpointRequest,
    CheckpointStatus,
    ExitCode,
    ProgressReport,
    Role,
)
from psoperator.render import render_children
from pstrainer import progress
from pstrainer.cadence import Cadence
from pstrainer.config import (
    _FLAGS,
    DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
    ConfigError,
    load_config,
    parse_tf_config,
)
from pstrainer.exits import classify_exception, describe
from pstrainer.ondemand import CheckpointRequests, Outcome, parse_request, unanswered
from pstrainer.progress import ProgressServer, ProgressTracker, write_termination_message
from pstrainer.scoring import log_loss_and_auc

CLUSTER = {
    "chief": ["c-0.c.ns.svc.cluster.local:2222"],
    "ps": ["p-0.p.ns.svc.cluster.local:2222", "p-1.p.ns.svc.cluster.local:2222"],
    "worker": ["w-0.w.ns.svc.cluster.local:2222"],
}


def env_for(role: str, index: int = 0, **extra: str) -> dict[str, str]:
    env = {
        "TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": role, "index": index}}),
        "PSOP_ROLE": role,
        "PSOP_TASK_INDEX": str(index),
        "PSOP_CHECKPOINT_DIR": "/ckpt",
    }
    env.update(extra)
    return env


# --- configuration --------------------------------------------------------------------------------


def test_config_from_the_rendered_pod_env() -> None:
    children = render_children(ctr_job(Path("/ckpt"), ["--steps=10"]))
    ps_set = next(c for c in children if c["kind"] == "StatefulSet" and c["metadata"]["name"] == "ctr-ps")
    pod, template = statefulset_pod(ps_set, 1)
    config = load_config([], resolve_env(template["spec"]["containers"][0], pod))
    assert (config.task.role, config.task.task_index, config.task.pod_name) == (Role.PS, 1, "ctr-ps-1")
    assert config.task.checkpoint_interval_steps == 100 and config.task.checkpoint_interval_seconds is None
    assert config.task.connect_timeout_seconds == 120 and config.task.progress_port == 8470
    assert config.task.termination_message_path == "/dev/termination-log"
    assert config.model.num_shards == 2  # one per parameter server by default


def test_the_chief_alone_is_told_checkpoint_before_stop_seconds_as_its_longest_hold() -> None:
    job = ctr_job(Path("/ckpt"), ["--steps=10"])
    job["spec"]["failurePolicy"] = {"checkpointBeforeStopSeconds": 45}
    children = render_children(job)
    chief_job = next(c for c in children if c["kind"] == "Job")
    ps_set = next(c for c in children if c["kind"] == "StatefulSet" and c["metadata"]["name"] == "ctr-ps")
    chief = load_config(
        [], resolve_env(job_pod(chief_job)[1]["spec"]["containers"][0], job_pod(chief_job)[0])
    )
    pod, template = statefulset_pod(ps_set, 0)
    assert chief.task.checkpoint_before_stop_seconds == 45
    assert "PSOP_CHECKPOINT_BEFORE_STOP_SECONDS" not in resolve_env(template["spec"]["containers"][0], pod)
    assert load_config([], env_for("chief")).task.checkpoint_before_stop_seconds == 60  # the spec's default


def test_flags_override_the_environment_which_overrides_defaults() -> None:
    config = load_config(["--steps=7"], env_for("chief", PSTRAINER_STEPS="5", PSTRAINER_VOCAB_SIZE="33"))
    assert (config.steps, config.model.vocab_size, config.model.embedding_dim) == (7, 33, 16)
    assert config.task.checkpoint_interval_seconds == DEFAULT_CHECKPOINT_INTERVAL_SECONDS
    assert config.task.termination_message_path is None
    # Both within Kubernetes' default termination grace of 30 s.
    assert (config.task.termination_checkpoint_seconds, config.task.ps_drain_seconds) == (20, 20)
    drained = load_config(
        ["--termination-checkpoint-seconds=5"], env_for("ps", PSTRAINER_PS_DRAIN_SECONDS="0")
    )
    assert (drained.task.termination_checkpoint_seconds, drained.task.ps_drain_seconds) == (5, 0)


def test_evaluator_needs_no_cluster() -> None:
    env = {"TF_CONFIG": json.dumps({"task": {"type": "evaluator"}}), "PSOP_CHECKPOINT_DIR": "/ckpt"}
    config = load_config([], env)
    assert (config.task.role, config.task.cluster) == (Role.EVALUATOR, {})


@pytest.mark.parametrize(
    ("env", "argv", "fragment"),
    [
        ({}, [], "TF_CONFIG is not set"),
        ({"TF_CONFIG": "{bad"}, [], "not JSON"),
        ({"TF_CONFIG": "[]"}, [], "not a JSON object"),
        ({"TF_CONFIG": '{"cluster": {}}'}, [], "no task"),
        ({"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "boss"}})}, [], "unknown task type"),
        (env_for("ps", 2), [], "not in the cluster"),
        ({"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "ps", "index": -1}})}, [], "index"),
        ({"TF_CONFIG": json.dumps({"cluster": {"chief": ["x:1"]}, "task": {"type": "chief"}})}, [], "no ps"),
        (
            {"TF_CONFIG": json.dumps({"cluster": {**CLUSTER, "ps": ["nohost"]}, "task": {"type": "chief"}})},
            [],
            "host:port",
        ),
        ({**env_for("chief"), "PSOP_ROLE": "ps"}, [], "PSOP_ROLE=ps"),
        ({**env_for("ps", 1), "PSOP_TASK_INDEX": "0"}, [], "PSOP_TASK_INDEX=0"),
        ({**env_for("chief"), "PSOP_CHECKPOINT_DIR": ""}, [], "PSOP_CHECKPOINT_DIR is required"),
        ({**env_for("chief"), "PSOP_CHECKPOINT_INTERVAL_STEPS": "0"}, [], "PSOP_CHECKPOINT_INTERVAL_STEPS"),
        ({**env_for("chief"), "PSOP_CONNECT_TIMEOUT_SECONDS": "soon"}, [], "PSOP_CONNECT_TIMEOUT_SECONDS"),
        ({**env_for("chief"), "PSOP_PROGRESS_PORT": "70000"}, [], "not a port"),
        (env_for("chief"), ["--steps=0"], "--steps"),
        (env_for("chief"), ["--no-such-flag"], "unrecognized"),
        (env_for("chief", PSTRAINER_STEPS="many"), [], "--steps"),
        (env_for("chief"), ["--partitioner=round"], "--partitioner"),
        (env_for("chief"), ["--inject-fault=typo"], "--inject-fault"),
        (env_for("ps", PSTRAINER_PS_DRAIN_SECONDS="-1"), [], "--ps-drain-seconds"),
        (env_for("chief"), ["--termination-checkpoint-seconds=0"], "--termination-checkpoint-seconds"),
    ],
)
def test_bad_configuration_is_a_config_error(env: dict[str, str], argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(argv, env)
    assert fragment in str(caught.value)


def test_parse_tf_config_accepts_the_renderer_shape() -> None:
    cluster, role, index = parse_tf_config(
        json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 0}})
    )
    assert (cluster, role, index) == (CLUSTER, Role.WORKER, 0)


# --- exit codes -----------------------------------------------------------------------------------


class FakeUnavailable(Exception):
    pass


class FakeInvalidArgument(Exception):
    pass


class Wrapper(Exception):
    """Like the coordinator's ClosureInputError / ClosureAbortedError."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original_exception = original


RETRYABLE = (FakeUnavailable,)


def _raised_from(cause: BaseException) -> BaseException:
    try:
        raise RuntimeError("wrapped") from cause
    except RuntimeError as err:
        return err


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (FakeUnavailable("GRPC error information from remote target /job:ps"), ExitCode.RETRYABLE),
        (FakeInvalidArgument("GRPC error information from remote target /job:worker"), ExitCode.PERMANENT),
        (Wrapper(FakeUnavailable("x")), ExitCode.RETRYABLE),
        (Wrapper(Wrapper(FakeUnavailable("x"))), ExitCode.RETRYABLE),
        (Wrapper(FakeInvalidArgument("x")), ExitCode.PERMANENT),
        (_raised_from(FakeUnavailable("x")), ExitCode.RETRYABLE),
        (ConfigError("bad"), ExitCode.BAD_CONFIG),
        (ValueError("shapes do not match"), ExitCode.PERMANENT),
        (KeyboardInterrupt(), ExitCode.TERMINATED),
    ],
)
def test_classification_is_by_type(exc: BaseException, code: ExitCode) -> None:
    assert classify_exception(exc, RETRYABLE) == code


def test_describe_is_one_short_line() -> None:
    assert describe(ValueError("first\nsecond")) == "ValueError: first"
    assert len(describe(ValueError("x" * 10_000))) == 400


@pytest.mark.tensorflow
def test_classification_of_real_tensorflow_errors() -> None:
    tf = pytest.importorskip("tensorflow")
    from tensorflow.python.distribute.coordinator.cluster_coordinator import ClosureInputError

    from pstrainer.runtime import _retryable_types

    retryable = _retryable_types()
    for name in ("UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError"):
        error = getattr(tf.errors, name)(None, None, "GRPC error information")
        assert classify_exception(error, retryable) == ExitCode.RETRYABLE
        assert classify_exception(ClosureInputError(error), retryable) == ExitCode.RETRYABLE
    bug = tf.errors.InvalidArgumentError(None, None, "GRPC error information from remote target /job:ps")
    assert classify_exception(bug, retryable) == ExitCode.PERMANENT
    assert classify_exception(tf.errors.NotFoundError(None, None, "x"), retryable) == ExitCode.PERMANENT


# --- cadence --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "total", "dispatch", "interval", "expected"),
    [
        (0, 1000, 20, 100, 20),
        (90, 1000, 20, 100, 10),  # stops on the checkpoint boundary
        (100, 1000, 20, 100, 20),
        (990, 1000, 20, None, 10),  # never past the end
        (1000, 1000, 20, None, 0),
        (0, 1000, 20, 7, 7),
    ],
)
def test_next_dispatch(step: int, total: int, dispatch: int, interval: int | None, expected: int) -> None:
    assert Cadence(total, dispatch, interval, None).next_dispatch(step) == expected


def test_every_boundary_is_reached_exactly() -> None:
    cadence, step, stops = Cadence(1000, 30, 100, None), 0, []
    while step < 1000:
        step += cadence.next_dispatch(step)
        stops.append(step)
    assert {100 * k for k in range(1, 11)} <= set(stops)


@pytest.mark.parametrize(
    ("cadence", "step", "now", "last_step", "last_time", "due"),
    [
        (Cadence(1000, 20, 100, None), 100, 0.0, 0, 0.0, True),
        (Cadence(1000, 20, 100, None), 120, 0.0, 100, 0.0, False),
        (Cadence(1000, 20, 100, None), 100, 0.0, 100, 0.0, False),
        (Cadence(1000, 20, None, 60.0), 40, 59.0, 0, 0.0, False),
        (Cadence(1000, 20, None, 60.0), 40, 60.0, 0, 0.0, True),
        (Cadence(1000, 20, 100, 60.0), 40, 61.0, 0, 0.0, True),
        (Cadence(1000, 20, None, 60.0), 40, 600.0, 40, 0.0, False),  # nothing new since the last save
    ],
)
def test_checkpoint_due(
    cadence: Cadence, step: int, now: float, last_step: int, last_time: float, due: bool
) -> None:
    assert cadence.checkpoint_due(step, now, last_step, last_time) is due


# --- progress -------------------------------------------------------------------------------------


def test_tracker_report_and_termination_message(tmp_path: Path) -> None:
    tracker = ProgressTracker(total_steps=100)
    tracker.update(state="running", step=40, loss=0.5, checkpoint_step=30, checkpoint_path="/c/ckpt-30")
    final = tracker.finish(ExitCode.RETRYABLE, "UnavailableError: ps gone")
    path = tmp_path / "dir" / "termination-log"
    write_termination_message(str(path), final)
    parsed = ProgressReport.parse(path.read_text())
    assert parsed is not None
    assert (parsed.state, parsed.step, parsed.total_steps, parsed.exit_code) == ("failed", 40, 100, 138)
    assert (parsed.checkpoint_step, parsed.message) == (30, "UnavailableError: ps gone")
    assert json.loads(path.read_text())["checkpointStep"] == 30  # the wire format uses the aliases
    write_termination_message(None, final)  # outside Kubernetes: nothing to do
    # Never raises: a missing or broken path only loses the message.
    write_termination_message(str(path / "under-a-file"), final)
    write_termination_message(str(tmp_path / "nul\0byte"), final)


def test_progress_server_serves_report_and_metrics() -> None:
    tracker = ProgressTracker(total_steps=10)
    tracker.update(
        state="running", step=3, examples_per_second=123.5, checkpoint_step=2, checkpoint_time=1.5e9
    )
    server = ProgressServer(tracker, port=0, host="127.0.0.1").start()
    try:

        def get(path: str) -> tuple[int, bytes]:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            try:
                connection.request("GET", path)
                response = connection.getresponse()
                return response.status, response.read()
            finally:
                connection.close()

        status, body = get("/progress")
        assert status == 200 and ProgressReport.parse(body) == tracker.snapshot()
        status, metrics = get("/metrics")
        text = metrics.decode()
        assert status == 200
        assert "pstrainer_global_step 3.0" in text and "pstrainer_total_steps 10.0" in text
        assert "pstrainer_examples_per_second 123.5" in text
        assert "pstrainer_last_checkpoint_step 2.0" in text
        assert "pstrainer_last_checkpoint_timestamp_seconds 1.5e+09" in text
        assert get("/nothing")[0] == 404
    finally:
        server.stop()


def test_the_library_needs_nothing_but_the_standard_library_until_tensorflow_is_used() -> None:
    """What a user's image gets from `pip install pstrainer-*.whl`: the contract, the task, `main`,
    the progress port, on a Python that sees no site-packages (no pydantic, no psoperator, no
    TensorFlow)."""
    source = Path(pstrainer.__file__).parent.parent
    modules = ["pstrainer", "pstrainer.contract", "pstrainer.task", "pstrainer.runtime", "pstrainer.progress"]
    result = subprocess.run(
        [sys.executable, "-S", "-c", "; ".join(f"import {module}" for module in modules)],
        env={"PYTHONPATH": str(source)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_metrics_are_what_prometheus_parses() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    tracker = ProgressTracker(total_steps=10)
    tracker.update(step=3, loss=0.25, checkpoint_time=1_790_000_000.5)
    for seconds in (0.02, 7.0):
        tracker.step_seconds.observe(seconds)
    text = tracker.registry.exposition().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    gauges = [family for family in families.values() if family.type == "gauge"]
    values = {family.name: sample.value for family in gauges for sample in family.samples}
    assert values == {
        "pstrainer_global_step": 3,
        "pstrainer_total_steps": 10,
        "pstrainer_loss": 0.25,
        "pstrainer_last_checkpoint_timestamp_seconds": 1_790_000_000.5,
    }  # the gauges of values not reported yet are not exposed
    step = families["pstrainer_step_seconds"]
    assert step.type == "histogram" and step.documentation.startswith("Wall time of one global step")
    buckets = {s.labels["le"]: s.value for s in step.samples if s.name.endswith("_bucket")}
    assert (buckets["0.01"], buckets["0.025"], buckets["5.0"], buckets["10.0"], buckets["+Inf"]) == (
        0,
        1,
        1,
        2,
        2,
    )
    totals = {s.name: s.value for s in step.samples if not s.name.endswith("_bucket")}
    assert totals == {"pstrainer_step_seconds_count": 2, "pstrainer_step_seconds_sum": 7.02}


def _post(
    port: int, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, CheckpointAnswer | None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, CheckpointAnswer.parse(response.read())
    finally:
        connection.close()


def test_progress_server_takes_checkpoint_requests() -> None:
    requests = CheckpointRequests()
    server = ProgressServer(ProgressTracker(), port=0, host="127.0.0.1", requests=requests).start()
    try:
        status, answer = _post(server.port, "/checkpoint")
        assert status == 503 and answer is not None and answer.reason == "the chief is not training yet"
        status, answer = _post(server.port, "/checkpoint?deadlineSeconds=-1")
        assert status == 400 and answer is not None and "deadlineSeconds" in (answer.reason or "")
        status, answer = _post(server.port, "/checkpoint", b"[1]")
        assert status == 400 and answer is not None and answer.reason == "the body is not a JSON object"
        assert _post(server.port, "/progress")[0] == 404
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(b"POST /checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.0 400 ")
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("GET", "/checkpoint")
        assert connection.getresponse().status == 405
        connection.close()
    finally:
        server.stop()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_with_a_token_file_the_report_and_checkpoints_answer_its_bearer_alone(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")  # as a Secret's file may end
    requests = CheckpointRequests()
    server = ProgressServer(ProgressTracker(), 0, "127.0.0.1", requests, token_file=str(token_file)).start()
    right, wrong = {"Authorization": "Bearer s3cret"}, {"Authorization": "Bearer s3cre7"}
    try:
        for headers in ({}, wrong, {"Authorization": "Basic s3cret"}, {"Authorization": "s3cret"}):
            refused = _get(server.port, "/progress", headers)
            assert refused.status == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
            # Refused before its body is read: no 400 for a body that is no JSON, nothing queued.
            status, answer = _post(server.port, "/checkpoint?holdSeconds=3600", b"{", headers)
            assert status == 401 and answer is not None and "Bearer" in (answer.reason or "")
        assert _get(server.port, "/progress", right).status == 200
        assert _post(server.port, "/checkpoint", b"", right)[0] == 503  # not training yet: asked
        assert _get(server.port, "/healthz").status == 200 and _get(server.port, "/metrics").status == 200
        token_file.write_text("n3w")  # read at each request
        assert _get(server.port, "/progress", right).status == 401
        assert _get(server.port, "/progress", {"Authorization": "bearer n3w"}).status == 200
        token_file.unlink()  # no token to be had: nobody is answered
        assert _get(server.port, "/progress", {"Authorization": "bearer n3w"}).status == 401
        assert _get(server.port, "/progress", {}).status == 401
    finally:
        server.stop()


def test_the_token_file_comes_from_the_rendered_chiefs_environment() -> None:
    chief_job = next(c for c in render_children(ctr_job(Path("/ckpt"), ["--steps=10"])) if c["kind"] == "Job")
    pod, template = job_pod(chief_job)
    config = load_config([], resolve_env(template["spec"]["containers"][0], pod))
    assert config.task.chief_token_file == "/var/run/secrets/psoperator.io/chief-token/token"
    assert load_config([], env_for("chief")).task.chief_token_file is None  # an older operator: none


class _Training:
    """The training loop's side in a thread: serves the requests (FakeLoop) until stopped."""

    def __init__(self, requests: CheckpointRequests) -> None:
        self.requests, self.loop, self.stopping = requests, FakeLoop(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.holds: list[float] = []  # how long each serve that answered a request took

    def _run(self) -> None:
        while not self.stopping.is_set():
            served, began = self.loop.served, time.monotonic()
            self.requests.serve(self.loop.on_request)
            if self.loop.served > served:
                self.holds.append(time.monotonic() - began)
            time.sleep(0.01)  # a step

    def __enter__(self) -> _Training:
        self.requests.open()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(10)


def test_a_hold_asked_over_http_lasts_checkpoint_before_stop_seconds_at_most() -> None:
    requests = CheckpointRequests()
    server = ProgressServer(ProgressTracker(), 0, "127.0.0.1", requests, max_hold_seconds=0.5).start()
    try:
        with _Training(requests) as training:
            status, answer = _post(server.port, "/checkpoint?holdSeconds=3600")
            assert status == 200 and answer is not None and answer.saved
            _wait_until("the hold's end", lambda: bool(training.holds), timeout=5)  # not an hour
            assert 0.5 <= training.holds[0] < 3
    finally:
        server.stop()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _closed_within(connection: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection (no answer) within `seconds`."""
    connection.settimeout(seconds)
    try:
        return connection.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_connection_that_does_not_send_its_request_in_time_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "REQUEST_READ_SECONDS", 0.5)
    server = ProgressServer(ProgressTracker(), port=0, host="127.0.0.1").start()
    try:
        with _connect(server.port) as idle, _connect(server.port) as trickling:
            trickling.sendall(b"GET /progress HTTP/1.1\r\n")
            began = time.monotonic()
            for _ in range(4):  # a header line every 0.2 s: each read comes in time, the whole does not
                time.sleep(0.2)
                with contextlib.suppress(OSError):
                    trickling.sendall(b"X-Slow: 1\r\n")
            assert _closed_within(idle, 5) and _closed_within(trickling, 5)
            assert time.monotonic() - began < 4
    finally:
        server.stop()


def test_connections_beyond_the_cap_are_closed_unanswered_and_served_again_once_below() -> None:
    server = ProgressServer(ProgressTracker(), port=0, host="127.0.0.1").start()
    held = [_connect(server.port) for _ in range(progress.MAX_CONNECTIONS)]
    try:
        for connection in held:  # each has its thread: a request line sent, its headers not yet
            connection.sendall(b"GET /progress HTTP/1.1\r\n")
        extra = _connect(server.port)
        extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert _closed_within(extra, 5)
        extra.close()
    finally:
        for connection in held:
            connection.close()
    try:
        _wait_until("a request served again", lambda: _healthz(server.port) == 200)
    finally:
        server.stop()


def _healthz(port: int) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


# --- checkpoint requests --------------------------------------------------------------------------


def test_request_parameters_from_the_body_and_the_query_which_wins() -> None:
    params = parse_request("holdSeconds=5", b'{"deadlineSeconds": 7, "holdSeconds": 1}')
    assert (params.deadline_seconds, params.hold_seconds) == (7, 5)
    assert parse_request("", b"").deadline_seconds == DEFAULT_CHECKPOINT_DEADLINE_SECONDS
    for query, body, fragment in (
        ("deadlineSeconds=soon", b"", "deadlineSeconds"),
        ("holdSeconds=-1", b"", "holdSeconds"),
        ("", b"{", "not JSON"),
    ):
        with pytest.raises(ValueError, match=fragment):
            parse_request(query, body)


def test_unanswered_names_the_first_address_that_refuses() -> None:
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        open_address = f"127.0.0.1:{listening.getsockname()[1]}"
        closed_address = f"127.0.0.1:{closed.getsockname()[1]}"
        assert unanswered([open_address], 2) is None
        reason = unanswered([open_address, closed_address], 2)
        assert reason is not None and reason.startswith(f"{closed_address} does not answer")


def _ask_in_thread(requests: CheckpointRequests, **params: float) -> tuple[threading.Thread, list[Outcome]]:
    outcomes: list[Outcome] = []
    request = CheckpointRequest.from_json_object(params)
    thread = threading.Thread(target=requests.ask, args=(request, outcomes.append), daemon=True)
    thread.start()
    return thread, outcomes


def _wait_until(what: str, check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class FakeLoop:
    """The training loop's side: one save per step, the latest checkpoint answered again."""

    def __init__(self) -> None:
        self.step, self.saves, self.served = 10, 0, 0

    def on_request(self) -> Outcome:
        self.served += 1
        fresh = self.saves == 0
        self.saves += fresh
        return CheckpointStatus.SAVED, CheckpointAnswer(checkpoint_step=self.step, saved=fresh)


def test_queued_requests_are_answered_by_the_loop_once_and_idempotently() -> None:
    requests, loop = CheckpointRequests(), FakeLoop()
    requests.open()
    asked = [_ask_in_thread(requests, deadlineSeconds=10) for _ in range(2)]
    _wait_until("both queued", lambda: len(requests._pending) == 2)
    requests.serve(loop.on_request)
    for thread, _ in asked:
        thread.join(5)
    answers = sorted((saved.saved for _, outcomes in asked for _, saved in outcomes), reverse=True)
    assert answers == [True, False] and loop.saves == 1
    requests.serve(loop.on_request)  # nothing queued: returns at once, saves nothing
    assert loop.saves == 1


def test_a_request_past_its_deadline_is_answered_504_and_dropped() -> None:
    requests, loop = CheckpointRequests(), FakeLoop()
    requests.open()
    thread, outcomes = _ask_in_thread(requests, deadlineSeconds=0.05)
    thread.join(5)
    assert outcomes[0][0] == CheckpointStatus.DEADLINE_EXCEEDED
    assert outcomes[0][1].reason == "no checkpoint within the deadline of 0.05 s"
    requests.serve(loop.on_request)
    assert loop.saves == 0


def test_a_hold_keeps_the_loop_answering_until_it_ends() -> None:
    requests, loop = CheckpointRequests(), FakeLoop()
    requests.open()
    first, _ = _ask_in_thread(requests, deadlineSeconds=10, holdSeconds=0.5)
    _wait_until("queued", lambda: bool(requests._pending))
    began = time.monotonic()
    serving = threading.Thread(target=requests.serve, args=(loop.on_request,), daemon=True)
    serving.start()
    first.join(5)
    second, outcomes = _ask_in_thread(requests, deadlineSeconds=10)
    second.join(5)
    assert outcomes[0][1] == CheckpointAnswer(checkpoint_step=10, saved=False)  # during the hold
    serving.join(5)
    assert time.monotonic() - began >= 0.5 and loop.saves == 1


def test_asking_again_for_the_checkpoint_held_does_not_extend_its_hold() -> None:
    """An asker who asks every half hold: the hold still ends one hold after the save."""
    requests, loop = CheckpointRequests(), FakeLoop()
    requests.open()
    first, _ = _ask_in_thread(requests, deadlineSeconds=10, holdSeconds=1)
    _wait_until("queued", lambda: bool(requests._pending))
    serving = threading.Thread(target=requests.serve, args=(loop.on_request,), daemon=True)
    began = time.monotonic()
    serving.start()
    first.join(5)
    while serving.is_alive() and time.monotonic() - began < 4:
        _ask_in_thread(requests, deadlineSeconds=0.2, holdSeconds=1)
        time.sleep(0.5)
    serving.join(5)
    assert time.monotonic() - began < 2.5 and loop.saves == 1 and loop.served >= 2


def test_a_refused_request_does_not_hold() -> None:
    requests = CheckpointRequests()
    requests.open()
    asked, outcomes = _ask_in_thread(requests, deadlineSeconds=10, holdSeconds=60)
    _wait_until("queued", lambda: bool(requests._pending))
    refusal = (CheckpointStatus.REFUSED, CheckpointAnswer(reason="a parameter server is gone: x"))
    serving = threading.Thread(target=requests.serve, args=(lambda: refusal,), daemon=True)
    serving.start()
    serving.join(5)
    asked.join(5)
    assert not serving.is_alive() and outcomes == [refusal]


def test_closing_answers_the_queue_and_every_later_request() -> None:
    requests = CheckpointRequests()
    requests.open()
    thread, outcomes = _ask_in_thread(requests, deadlineSeconds=10)
    _wait_until("queued", lambda: bool(requests._pending))
    refusal = (CheckpointStatus.REFUSED, CheckpointAnswer(reason="training failed: UnavailableError: x"))
    requests.close(refusal)
    thread.join(5)
    later, later_outcomes = _ask_in_thread(requests, deadlineSeconds=10)
    later.join(5)
    assert outcomes == later_outcomes == [refusal]


def test_log_loss_and_auc() -> None:
    loss, auc = log_loss_and_auc([0, 0, 1, 1], [-2.0, -1.0, 1.0, 2.0])
    assert auc == 1.0 and 0 < loss < 0.35
    assert log_loss_and_auc([0, 1, 0, 1], [1.0, -1.0, 2.0, -2.0])[1] == 0.0
    assert log_loss_and_auc([1, 1], [0.0, 0.0])[0] == pytest.approx(0.693147, rel=1e-5)


# --- the entrypoint's config and signal paths, as processes (no TensorFlow is imported) ------------


def _run_entrypoint(env: dict[str, str], tmp_path: Path) -> tuple[int, ProgressReport | None, str]:
    if importlib.util.find_spec("pstrainer") is None:
        if os.environ.get("CI"):
            pytest.fail("pstrainer must be installed in CI (pip install -e images/trainer)")
        pytest.skip("pstrainer is not installed")
    termination = tmp_path / "termination-log"
    full_env = {"PATH": os.environ.get("PATH", ""), "PSOP_TERMINATION_MESSAGE_PATH": str(termination), **env}
    # Its own network namespace when root can make one: nothing here listens, but nothing could leak.
    prefix = ["unshare", "--net"] if os.geteuid() == 0 and shutil.which("unshare") else []
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "pstrainer"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = ProgressReport.parse(termination.read_bytes()) if termination.exists() else None
    return done.returncode, report, done.stdout + done.stderr


@pytest.mark.parametrize(
    "env",
    [
        {"TF_CONFIG": '{"cluster": {"chief": ['},
        {**env_for("chief"), "PSOP_ROLE": "worker"},
    ],
)
def test_bad_configuration_exits_2_with_a_termination_message(env: dict[str, str], tmp_path: Path) -> None:
    code, report, output = _run_entrypoint(env, tmp_path)
    assert code == ExitCode.BAD_CONFIG, output
    assert report is not None and report.exit_code == ExitCode.BAD_CONFIG and report.state == "failed"
    assert report.message is not None and report.message.startswith("bad configuration:")
    assert "tensorflow" not in output.lower()


def test_sigterm_watcher_takes_the_signal_whatever_the_main_thread_does(tmp_path: Path) -> None:
    """The main thread is stuck in a blocking call that Python signal handlers would never interrupt."""
    script = (
        "import threading, sys\n"
        "from pstrainer.exits import Exiter, watch_sigterm\n"
        "exiter = Exiter(); watch_sigterm(exiter)\n"
        "exiter.on_exit(lambda code, msg: open(sys.argv[1], 'w').write(f'{code} {msg}'))\n"
        "print('ready', flush=True)\n"
        "threading.Event().wait()\n"
    )
    marker = tmp_path / "exit"
    process = subprocess.Popen([sys.executable, "-c", script, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == ExitCode.TERMINATED
        assert marker.read_text() == "143 terminated by SIGTERM"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_sigterm_is_taken_when_threads_started_before_the_watcher() -> None:
    """A user's program imports TensorFlow, whose threads start at once, before `pstrainer.main`."""
    script = (
        "import threading\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "from pstrainer.exits import Exiter, watch_sigterm\n"
        "exiter = Exiter(); watch_sigterm(exiter)\n"
        "print('ready', flush=True)\n"
        "threading.Event().wait()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == ExitCode.TERMINATED
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _run_script(body: str, tmp_path: Path) -> tuple[int, float, str]:
    """Run a script that sets up an Exiter with the SIGTERM watcher, SIGTERM it once it is ready."""
    script = (
        "import sys, threading, time\n"
        "from pstrainer.exits import Exiter, keep_serving, watch_sigterm\n"
        "exiter = Exiter(); watch_sigterm(exiter)\n"
        "exiter.on_exit(lambda code, msg: open(sys.argv[1], 'w').write(f'{code} {msg}'))\n"
        f"{body}\n"
    )
    marker = tmp_path / "exit"
    process = subprocess.Popen([sys.executable, "-c", script, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = process.wait(10)
        return code, time.monotonic() - sent, marker.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_a_parameter_server_serves_its_drain_time_after_sigterm(tmp_path: Path) -> None:
    code, took, marker = _run_script(
        "exiter.before_termination(keep_serving(0.5))\nprint('ready', flush=True)\nthreading.Event().wait()",
        tmp_path,
    )
    assert (code, marker) == (ExitCode.TERMINATED, "143 terminated by SIGTERM")
    assert took >= 0.5


def test_a_failure_during_the_action_before_termination_still_exits_143(tmp_path: Path) -> None:
    """The chief's save fails because a parameter server is gone too: still a stop, not a crash."""
    code, _, marker = _run_script(
        "started = threading.Event()\n"
        "exiter.before_termination(lambda: (started.set(), threading.Event().wait(30)))\n"
        "print('ready', flush=True)\n"
        "started.wait(); exiter.exit(138, 'UnavailableError: ps gone')",
        tmp_path,
    )
    assert (code, marker) == (ExitCode.TERMINATED, "143 terminated by SIGTERM")


DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"


def test_the_runtime_contract_page_lists_every_trainer_metric() -> None:
    page = (DOCS / "runtime.md").read_text()
    for family in ProgressTracker().registry.collect():
        assert f"| `{family.name}` | {family.type} | {family.documentation} |" in page, family.name


def test_the_trainer_page_lists_every_flag_with_its_default() -> None:
    page = (DOCS / "trainer.md").read_text()
    for flag, _, default, _ in _FLAGS:
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert f"| `--{flag}` | {shown} |" in page, flag


def test_a_cluster_too_large_for_the_environment_is_read_from_its_mounted_file(tmp_path: Path) -> None:
    """The pod as the kubelet starts it: no TF_CONFIG, the ConfigMap's file at PSOP_TF_CONFIG_FILE."""
    job = ctr_job(tmp_path / "ckpt", [])
    job["spec"]["worker"]["replicas"] = 600
    children = {(c["kind"], c["metadata"]["name"]): c for c in render_children(job)}
    config_map = children[("ConfigMap", "ctr-tf-config")]
    pod, template = statefulset_pod(children[("StatefulSet", "ctr-worker")], 599)
    env = resolve_env(template["spec"]["containers"][0], pod)
    assert "TF_CONFIG" not in env
    mounted = tmp_path / "cluster.json"  # where the ConfigMap's volume would put it
    mounted.write_text(config_map["data"]["cluster.json"])
    config = load_config([], {**env, "PSOP_TF_CONFIG_FILE": str(mounted)})
    assert (config.task.role, config.task.task_index, len(config.task.cluster["worker"])) == (
        Role.WORKER,
        599,
        600,
    )
    assert config.task.cluster["worker"][599].startswith("ctr-worker-599.ctr-worker.")
    with pytest.raises(ConfigError, match="PSOP_TF_CONFIG_FILE"):
        load_config([], {**env, "PSOP_TF_CONFIG_FILE": str(tmp_path / "missing.json")})
