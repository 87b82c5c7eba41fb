"""An S3-compatible store for the tests of s3:// checkpoints: SeaweedFS's `weed server` with its S3
gateway, one identity and one bucket, on loopback or in a task's network namespace.

`weed` is built from the Go module proxy into the binary cache (`e2e/cluster/build.sh seaweedfs`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CACHE = Path(os.environ.get("PSOPERATOR_CACHE", Path.home() / ".cache" / "psoperator"))
WEED = CACHE / "bin" / "weed"
ACCESS_KEY = "psoperator-test"
SECRET_KEY = "a-test-secret-for-the-local-store"
S3_PORT, MASTER_PORT, VOLUME_PORT, FILER_PORT = 8333, 9333, 8080, 8888


@dataclass(frozen=True)
class Store:
    endpoint: str
    bucket: str

    def env(self, secret: str = SECRET_KEY) -> dict[str, str]:
        """What the operator renders from spec.checkpoint.s3 for this store, credentials resolved."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_REGION": "us-east-1",
            "S3_ADDRESSING_STYLE": "path",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
        }


def identities() -> dict[str, Any]:
    """The gateway's configuration: one identity allowed everything."""
    credentials = [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]
    return {"identities": [{"name": "tests", "credentials": credentials, "actions": ["Admin"]}]}


def _answers(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def start_store(
    workdir: Path,
    ip: str,
    bucket: str,
    output: IO[Any],
    prefix: Sequence[str] = (),
    answers: Callable[[str, int], bool] = _answers,
    timeout: float = 180.0,
    bind: str | None = None,
) -> tuple[subprocess.Popen[bytes], Store]:
    """`weed server` at `ip`, listening on `bind` (`ip` by default), run behind `prefix` (e.g.
    `ip netns exec NS`), ready, with `bucket`."""
    if not WEED.exists():
        raise FileNotFoundError(f"{WEED} is not built: run e2e/cluster/build.sh seaweedfs")
    data = workdir / "weed"
    data.mkdir(parents=True, exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(json.dumps(identities()))
    argv = [
        *prefix, str(WEED), "server", f"-ip={ip}", f"-ip.bind={bind or ip}", f"-dir={data}",
        f"-master.port={MASTER_PORT}", f"-volume.port={VOLUME_PORT}", "-volume.max=0",
        "-master.volumeSizeLimitMB=64", "-filer", f"-filer.port={FILER_PORT}",
        "-s3", f"-s3.port={S3_PORT}", f"-s3.config={config}",
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not answers(ip, S3_PORT):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"weed server did not answer on {ip}:{S3_PORT} (exit {process.poll()})")
        time.sleep(0.5)
    create_bucket(ip, bucket, prefix, deadline)
    return process, Store(endpoint=f"http://{ip}:{S3_PORT}", bucket=bucket)


def create_bucket(ip: str, bucket: str, prefix: Sequence[str], deadline: float) -> None:
    """`s3.bucket.create` in `weed shell`, until the filer it needs has come up."""
    while True:
        shell = subprocess.run(
            [*prefix, str(WEED), "shell", f"-master={ip}:{MASTER_PORT}"],
            input=f"s3.bucket.create -name {bucket}\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        said = shell.stdout + shell.stderr
        if shell.returncode == 0 and "error" not in said.lower():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"weed shell could not create bucket {bucket}: {said[-2000:]}")
        time.sleep(1)
