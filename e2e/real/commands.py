"""The commands the real-kubelet fixtures run (the kind cluster's script, the image build, helm, a
command on a node), each with its output kept for the failure message or in a log file under the
cache."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kubectl import _kubectl
from e2e.paths import CACHE, REPO
from e2e.util import free_port

KIND_SH = REPO / "e2e" / "cluster" / "kind.sh"
BUILD_IMAGES = REPO / "images" / "build.sh"
LOGS = CACHE / "real" / "logs"


def run(*args: str | Path, timeout: float = 600, log: str | None = None) -> str:
    """Runs a command; its stderr (or the log file named `log`) is in the error when it fails."""
    command = [str(a) for a in args]
    if log is None:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-6000:]}")
        return result.stdout
    LOGS.mkdir(parents=True, exist_ok=True)
    path = LOGS / log
    with path.open("w") as out:
        code = subprocess.run(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        ).returncode
    if code != 0:
        pytest.fail(f"{' '.join(command)} failed ({code}):\n{path.read_text(errors='replace')[-6000:]}")
    return path.read_text(errors="replace")


def load(*images: str, log: str) -> None:
    """Loads local images into the kind cluster's workers."""
    run("bash", KIND_SH, "load", *images, timeout=900, log=log)


def on_node(node: str, *args: str, timeout: float = 60) -> str:
    """Runs a command on a node (a kind node is a container); its stdout."""
    return run("docker", "exec", node, *args, timeout=timeout)


def helm(kubeconfig: Path, *args: str, timeout: float = 300) -> str:
    return run(CACHE / "bin" / "helm", "--kubeconfig", str(kubeconfig), *args, timeout=timeout)


# Run in a node's network namespace by the tests' own Python: GET argv[1], print the body; a status
# other than 200 or no answer within argv[2] seconds fails.
# GET argv[1] within argv[2] seconds, with the bearer token in $BEARER if set.
_FETCH = (
    "import os, sys, urllib.request; "
    "token = os.environ.get('BEARER'); "
    "headers = {'Authorization': 'Bearer ' + token} if token else {}; "
    "request = urllib.request.Request(sys.argv[1], headers=headers); "
    "sys.stdout.write(urllib.request.urlopen(request, timeout=float(sys.argv[2])).read().decode())"
)


@functools.cache
def _node_pid(node: str) -> int:
    return int(run("docker", "inspect", "-f", "{{.State.Pid}}", node))


def in_node_network(node: str) -> list[str]:
    """The command prefix that runs the rest in a node's network namespace (this machine's files)."""
    return ["nsenter", f"--net=/proc/{_node_pid(node)}/ns/net"]


def get_from_node(node: str, url: str, timeout: float = 3, token: str | None = None) -> str:
    """An HTTP GET from inside a node's network namespace, as the kubelet's probes are made: the
    pod network is reachable there, and NetworkPolicies admit a pod's own node. With `token`, as a
    bearer (a chief's progress port wants its job's). Raises ConnectionError (an OSError) when it
    gets no answer, or one that is no success."""
    env = {**os.environ, "BEARER": token or ""}
    result = subprocess.run(
        [*in_node_network(node), sys.executable, "-c", _FETCH, url, str(timeout)],
        capture_output=True, text=True, timeout=timeout + 30, check=False, stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    if result.returncode != 0:
        raise ConnectionError(f"GET {url} from {node}: {result.stderr.strip().splitlines()[-1:]}")
    return result.stdout


@contextlib.contextmanager
def port_forward(kubeconfig: Path, namespace: str, pod: str, port: int) -> Iterator[int]:
    """`kubectl port-forward` of a pod's port to a free local one, which it yields."""
    local = free_port()
    forward = subprocess.Popen(
        [_kubectl(), "--kubeconfig", str(kubeconfig), "port-forward", "-n", namespace, f"pod/{pod}",
         f"{local}:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:<local> -> <port>" once it listens
        assert "Forwarding from" in line, (line, forward.stderr.read() if forward.stderr else "")
        yield local
    finally:
        forward.terminate()
        forward.wait(timeout=30)
