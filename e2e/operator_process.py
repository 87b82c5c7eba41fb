"""The operator as the e2e tests run it: a real `python -m psoperator run` subprocess, started,
stopped, killed and restarted by the tests, its output in a log file."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.paths import CACHE, REPO
from e2e.util import free_port, wait_for
from psoperator.cli import CHIEF_KEY_FILE_ENV
from psoperator.control.chief_key import ChiefKey

OPERATOR_READY_TIMEOUT = 60.0
# The key of every operator the tests run, as the chart's replicas share theirs: one that takes over
# from another (a restart, a second replica) derives the same chiefs' tokens.
CHIEF_KEY_FILE = CACHE / "e2e-chief-key"


def chief_key() -> ChiefKey:
    """The tests' operators' key (CHIEF_KEY_FILE, made at its first use)."""
    if not CHIEF_KEY_FILE.exists():
        CHIEF_KEY_FILE.parent.mkdir(parents=True, exist_ok=True)
        made = CHIEF_KEY_FILE.with_suffix(f".{os.getpid()}")
        made.write_text(secrets.token_hex(32))
        made.replace(CHIEF_KEY_FILE)
    return ChiefKey.from_file(str(CHIEF_KEY_FILE))


class OperatorProcess:
    """The operator as a real subprocess: `python -m psoperator run --namespace NS --standalone`.

    Output goes to `log_path` (appended across restarts). `start()` waits until the liveness
    endpoint answers; `stop()` sends SIGTERM, then SIGKILL after `grace` seconds.
    """

    probe_path = "/healthz"  # what `start()` waits for, on the port `command()` is given

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        extra_args: list[str] | None = None,
        module: str = "psoperator",  # or a launcher of it (e2e/bench/traced.py)
    ):
        self.kubeconfig = kubeconfig
        self.module = module
        self.namespace = namespace
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        # Extra environment of the next start, e.g. PSOPERATOR_FAULT (psoperator/faults.py).
        self.extra_env: dict[str, str] = {}
        self.liveness_url = ""
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", self.module, "run",
            "--namespace", self.namespace,
            "--standalone",
            "--liveness", self.liveness_url,
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = OPERATOR_READY_TIMEOUT) -> None:
        self.launch()
        self.wait_live(timeout)

    def launch(self) -> None:
        """Starts the process without waiting for it to be live."""
        if self.running:
            raise RuntimeError("operator already running")
        self.liveness_url = f"http://127.0.0.1:{free_port()}{self.probe_path}"
        self.starts += 1
        chief_key()  # its file made
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONUNBUFFERED": "1",
            # In the environment, not a flag: an older version under test (test_upgrade) knows no key.
            CHIEF_KEY_FILE_ENV: str(CHIEF_KEY_FILE),
            **self.extra_env,
        }
        with self.log_path.open("ab") as log:
            log.write(f"=== start {self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.command(),
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_live(self, timeout: float = OPERATOR_READY_TIMEOUT) -> None:
        proc = self._proc
        assert proc is not None, "launch() first"

        def alive() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"operator exited with {proc.returncode}")
            return _http_ok(self.liveness_url)

        try:
            wait_for(
                alive, timeout=timeout, interval=0.3, message=f"operator liveness at {self.liveness_url}"
            )
        except Exception as exc:
            self.stop()
            pytest.fail(
                f"operator did not become live: {exc}\n--- operator log ---\n{self.log_text()[-6000:]}"
            )

    def stop(self, grace: float = 15.0) -> int | None:
        """Stops the operator; returns its exit code (None if it was not started)."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return proc.returncode

    def kill(self) -> int | None:
        """Kills the operator abruptly (SIGKILL), as a crash or an OOM kill would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        return self._proc.returncode if self._proc else None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(200 <= response.status < 300)
    except OSError:
        return False
