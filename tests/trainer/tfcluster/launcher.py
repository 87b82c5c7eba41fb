"""Run a PSTrainingJob's pods as local processes, with exactly the env the operator renders.

The manifests come from psoperator.render.render_children, the same code path as the operator;
each pod's environment and arguments are resolved as the kubelet would (kubelet.py), and each
task runs in its own network namespace (netns.py) under its Kubernetes DNS name. What the kubelet
would mount is simulated by a path substitution: the container's termination-message file becomes
a file in the work directory, and so does the chief's token (the Secret the operator makes), which
every request to the chief's progress port carries.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlencode

import psutil

from psoperator.contract import (
    CHECKPOINT_PATH,
    ENV_CHIEF_TOKEN_FILE,
    ENV_TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_PATH,
    CheckpointAnswer,
    ProgressReport,
)
from psoperator.render import RenderOptions, render_children
from tfcluster.kubelet import (
    Manifest,
    PodFacts,
    container_argv,
    job_pod,
    pod_fqdn,
    resolve_env,
    statefulset_pod,
)
from tfcluster.netns import PrivateNetwork

# The image's ENTRYPOINT (the `pstrainer` console script) as installed for this interpreter.
_SCRIPT = Path(sys.executable).parent / "pstrainer"
ENTRYPOINT = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "pstrainer"]
# What the image itself sets; the pod's env comes on top.
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1", "LANG": "C.UTF-8"}


@dataclass
class Pod:
    key: str  # e.g. "ps-1": the task's role and index, and its namespace suffix
    role: str
    facts: PodFacts
    template: Manifest
    fqdn: str
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    termination_path: Path | None = None


@dataclass
class Process:
    pod: Pod
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float
    _log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def rss_mib(self) -> float:
        return float(psutil.Process(self.popen.pid).memory_info().rss) / 2**20

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float) -> int:
        code = self.popen.wait(timeout)
        self._log.close()
        return code

    def stop(self) -> None:
        """SIGKILL if still running; always reaps."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def termination_message(self) -> ProgressReport | None:
        path = self.pod.termination_path
        return ProgressReport.parse(path.read_bytes()) if path and path.exists() else None


def _containers(template: Manifest) -> list[Manifest]:
    containers: list[Manifest] = template["spec"]["containers"]
    return containers


class LocalCluster:
    """A job's pods on one machine: ps-<i>, worker-<i>, chief-0 and evaluator-0, each in its own netns."""

    def __init__(
        self,
        job: Manifest,
        workdir: Path,
        network: PrivateNetwork,
        secret_data: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.job = job
        self.workdir = workdir
        self.network = network
        self.token = secrets.token_hex(32)  # the chief's, as the operator would derive it
        self.secrets = dict(secret_data or {})  # the data of the Secrets its pods' env refers to
        self.pods = self._pods(job, RenderOptions())
        self.processes: dict[str, Process] = {}
        self._starts = 0
        for pod in self.pods.values():
            network.add_host(pod.key, [pod.fqdn, pod.template["spec"].get("hostname") or pod.facts.name])
        network.write_name_files()

    def _pods(self, job: Manifest, options: RenderOptions) -> dict[str, Pod]:
        pods: dict[str, Pod] = {}
        for child in render_children(job, options):
            kind = child["kind"]
            if kind not in ("StatefulSet", "Job"):  # Services, NetworkPolicies: no pods
                continue
            role = child["metadata"]["labels"]["psoperator.io/role"]
            if kind == "StatefulSet":
                for ordinal in range(child["spec"]["replicas"]):
                    facts, template = statefulset_pod(child, ordinal)
                    pods[f"{role}-{ordinal}"] = self._pod(f"{role}-{ordinal}", role, facts, template)
            elif kind == "Job":
                facts, template = job_pod(child)
                pods[f"{role}-0"] = self._pod(f"{role}-0", role, facts, template)
        return pods

    def _pod(self, key: str, role: str, facts: PodFacts, template: Manifest) -> Pod:
        container = _containers(template)[0]
        env = resolve_env(container, facts, secrets=self.secrets)
        pod = Pod(key=key, role=role, facts=facts, template=template, fqdn=pod_fqdn(facts, template))
        # The kubelet mounts a per-container file at terminationMessagePath.
        mounted = container.get("terminationMessagePath", TERMINATION_MESSAGE_PATH)
        if env.get(ENV_TERMINATION_MESSAGE_PATH) == mounted:
            pod.termination_path = self.workdir / f"{key}.termination-log"
            env[ENV_TERMINATION_MESSAGE_PATH] = str(pod.termination_path)
        if ENV_CHIEF_TOKEN_FILE in env:  # the kubelet mounts the job's token Secret
            token_file = self.workdir / f"{key}.token"
            token_file.write_text(self.token)
            env[ENV_CHIEF_TOKEN_FILE] = str(token_file)
        pod.env = env
        pod.argv = container_argv(container, env, ENTRYPOINT)
        return pod

    def rerender(self, job: Manifest, attempt: int = 0) -> None:
        """Take the pods of a changed job (same names and replicas), e.g. a chief with other args."""
        fresh = self._pods(job, RenderOptions(attempt=attempt))
        if set(fresh) != set(self.pods) or any(fresh[k].fqdn != self.pods[k].fqdn for k in fresh):
            raise ValueError("rerender may not change the cluster's tasks")
        self.job, self.pods = job, fresh

    def ensure_servers(self, entrypoint: Sequence[str] | None = None) -> None:
        """Restart any ps or worker an earlier test left dead, as their StatefulSet would."""
        for key in self.pods:
            process = self.processes.get(key)
            if key.startswith(("ps-", "worker-")) and (process is None or process.poll() is not None):
                self.start(key, entrypoint)

    def start_chief(
        self, job: Manifest, attempt: int = 0, entrypoint: Sequence[str] | None = None
    ) -> Process:
        """The chief of `job` (the cluster's tasks, other args) for this attempt."""
        self.rerender(job, attempt=attempt)
        return self.start("chief-0", entrypoint)

    def start(self, key: str, entrypoint: Sequence[str] | None = None) -> Process:
        """Start a pod's process; with `entrypoint`, that program in place of the image's
        entrypoint, with the pod's args and env."""
        pod = self.pods[key]
        argv = (
            pod.argv
            if entrypoint is None
            else container_argv(_containers(pod.template)[0], pod.env, entrypoint)
        )
        if pod.termination_path and pod.termination_path.exists():
            pod.termination_path.unlink()
        self._starts += 1
        log_path = self.workdir / f"{key}.{self._starts}.log"
        output = log_path.open("wb")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            **IMAGE_ENV,
            **pod.env,
        }
        if "PYTHONPATH" in os.environ:  # a test of a source tree runs that tree's trainer
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        popen = self.network.popen(key, argv, env, output)
        process = Process(pod=pod, popen=popen, log_path=log_path, started=time.monotonic(), _log=output)
        self.processes[key] = process
        return process

    @property
    def _authorization(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def progress(self, key: str = "chief-0") -> ProgressReport | None:
        """The chief's GET /progress, or None while it does not answer."""
        port = int(self.pods[key].env.get("PSOP_PROGRESS_PORT", "8470"))
        try:
            status, body = self.network.http_get(key, port, "/progress", headers=self._authorization)
        except OSError:
            return None
        return ProgressReport.parse(body) if status == 200 else None

    def get(self, key: str, path: str) -> tuple[int, bytes]:
        port = int(self.pods[key].env.get("PSOP_PROGRESS_PORT", "8470"))
        status, body = self.network.http_get(key, port, path, headers=self._authorization)
        return status, body

    def checkpoint(self, timeout: float, **params: float) -> tuple[int, CheckpointAnswer]:
        """POST the chief's /checkpoint with these query parameters; the status and the answer."""
        port = int(self.pods["chief-0"].env.get("PSOP_PROGRESS_PORT", "8470"))
        path = f"{CHECKPOINT_PATH}?{urlencode(params)}"
        status, body = self.network.http_request(
            "chief-0", port, "POST", path, timeout=timeout, headers=self._authorization
        )
        answer = CheckpointAnswer.parse(body)
        if answer is None:
            raise AssertionError(f"POST {path} answered {status} with {body!r}")
        return status, answer

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.stop()


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll check() until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def progress_where(
    cluster: LocalCluster,
    chief: Process,
    what: str,
    predicate: Callable[[ProgressReport], bool],
    timeout: float = 120.0,
) -> ProgressReport:
    """Poll the chief's GET /progress until the report satisfies the predicate; fail at once if the
    chief exits."""

    def check() -> ProgressReport | None:
        if chief.poll() is not None:
            raise AssertionError(f"chief exited with {chief.poll()} early:\n{chief.log()[-4000:]}")
        report = cluster.progress()
        return report if report is not None and predicate(report) else None

    result: ProgressReport = wait_for(what, check, timeout)
    return result


def wait_exit(process: Process, timeout: float) -> int:
    """The process's exit code; an AssertionError with its log's tail if it runs past the timeout."""
    try:
        code: int = process.wait(timeout)
    except Exception as err:
        raise AssertionError(
            f"{process.pod.key} still running after {timeout:g} s:\n{process.log()[-4000:]}"
        ) from err
    return code


def tf_config_of(pod: Pod) -> Mapping[str, Any]:
    loaded: Mapping[str, Any] = json.loads(pod.env["TF_CONFIG"])
    return loaded
