"""The local control plane's own processes, restarted as a crash and its supervisor would.

kwokctl's binary runtime runs each component as a plain process: its command line in `kwok.yaml`,
its pid in `pids/`, its log in `logs/` of the cluster's directory (where the kubeconfig is). kwokctl
v0.8 can stop and start only the whole cluster, so a component is restarted here: SIGKILLed, then
started again as kwokctl starts it, its pid file updated for `kwokctl delete`.

A component that lost its leader lease while the API server was away exits (kube-controller-manager
and kube-scheduler do); `revive` starts it again, as the kubelet restarts a static pod, without its
health port (`--secure-port=0`): while it was down, another cluster on this machine may have taken
that port, and nothing here reads it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

import yaml
from kubernetes import client

from e2e.util import wait_for

APISERVER = "kube-apiserver"
LEADER_ELECTED = ("kube-controller-manager", "kube-scheduler")


def _gone(pid: int) -> bool:
    with suppress(ChildProcessError):  # a component started here is our child: reap it
        os.waitpid(pid, os.WNOHANG)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _ready(api: client.ApiClient) -> bool:
    url = f"{api.configuration.host}/readyz"
    response = api.rest_client.request("GET", url, _request_timeout=2)  # type: ignore[no-untyped-call]
    return bool(response.status == 200)


class ControlPlane:
    """The components of the kwokctl cluster whose admin kubeconfig is `kubeconfig`."""

    def __init__(self, kubeconfig: Path, api: client.ApiClient) -> None:
        self.workdir = kubeconfig.parent
        self.api = api
        configuration = next(
            d for d in yaml.safe_load_all((self.workdir / "kwok.yaml").read_text())
            if d and d.get("kind") == "KwokctlConfiguration"
        )  # fmt: skip
        self.components = {c["name"]: c for c in configuration["components"]}

    def _pid_file(self, name: str) -> Path:
        return self.workdir / "pids" / f"{name}.pid"

    def pid(self, name: str) -> int:
        return int(self._pid_file(name).read_text())

    def start(self, name: str, args: list[str] | None = None) -> subprocess.Popen[bytes]:
        """Starts the component with its own arguments, or `args`."""
        component = self.components[name]
        with (self.workdir / "logs" / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [component["binary"], *(component.get("args", []) if args is None else args)],
                cwd=component["workDir"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pid_file(name).write_text(str(process.pid))
        return process

    def restart_apiserver(self, timeout: float = 60.0) -> float:
        """SIGKILLs kube-apiserver and starts it again; returns the seconds until /readyz answers."""
        pid = self.pid(APISERVER)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _gone(pid), timeout=30, message=f"{APISERVER} (pid {pid}) to exit")
        process = self.start(APISERVER)

        def serving() -> bool:
            nonlocal process
            if process.poll() is not None:  # e.g. its port not free yet after the kill: again
                process = self.start(APISERVER)
                return False
            return _ready(self.api)

        wait_for(serving, timeout=timeout, interval=0.5, message=f"{APISERVER} ready again")
        return time.monotonic() - started

    def revive(self) -> list[str]:
        """Starts kube-controller-manager and kube-scheduler again if they exited; returns which."""
        dead = [name for name in LEADER_ELECTED if _gone(self.pid(name))]
        for name in dead:
            args = self.components[name].get("args", [])
            self.start(name, [a for a in args if not a.startswith("--secure-port=")] + ["--secure-port=0"])
        return dead
