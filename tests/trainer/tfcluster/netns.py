"""A private network made of Linux network namespaces: nothing outside the test can reach it.

One namespace holds a bridge; every task gets its own namespace whose eth0 is a veth on that
bridge, with loopback up and an /etc/netns/<name>/hosts that `ip netns exec` bind-mounts over
/etc/hosts, so the tasks resolve each other's Kubernetes DNS names. The host's own network
namespace is never touched (the veth pairs are created inside the bridge namespace). The test
process talks to a task with a socket opened inside the task's namespace (setns in a helper
thread), never through the host's network.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    return None


@dataclass(frozen=True)
class Host:
    netns: str
    ip: str
    names: tuple[str, ...]


class PrivateNetwork:
    def __init__(self, prefix: str, subnet: str = "10.231.0") -> None:
        self.prefix = prefix
        self.subnet = subnet
        self.bridge_ns = f"{prefix}-br"
        self.hosts: dict[str, Host] = {}
        self._created: list[str] = []

    def __enter__(self) -> PrivateNetwork:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        self._add_netns(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def add_host(self, key: str, names: Sequence[str]) -> Host:
        """A namespace for one task, reachable from the others at its names."""
        number = len(self.hosts) + 2
        netns, veth = f"{self.prefix}-{key}", f"v{number}"
        self._add_netns(netns)
        _ip("-n", self.bridge_ns, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("-n", self.bridge_ns, "link", "set", veth, "master", "br0")
        _ip("-n", self.bridge_ns, "link", "set", veth, "up")
        host = Host(netns=netns, ip=f"{self.subnet}.{number}", names=tuple(names))
        _ip("-n", netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        self.hosts[key] = host
        return host

    def write_name_files(self) -> None:
        """/etc/hosts and a resolv.conf (no DNS: names resolve from the hosts file only) per task."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
        lines += [f"{h.ip} {' '.join(h.names)}" for h in self.hosts.values()]
        for host in self.hosts.values():
            directory = NETNS_ETC_DIR / host.netns
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text("\n".join(lines) + "\n")
            (directory / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def popen(
        self, key: str, argv: Sequence[str], env: Mapping[str, str], output: IO[Any]
    ) -> subprocess.Popen[bytes]:
        """Start a process in a task's namespace; its pid is the program's (ip execs it)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[key].netns, *argv],
            env=dict(env),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def http_get(
        self, key: str, port: int, path: str, timeout: float = 2.0, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """GET http://<task>:<port><path> from inside the task's own namespace (its loopback)."""
        return self.http_request(key, port, "GET", path, timeout=timeout, headers=headers)

    def http_request(
        self,
        key: str,
        port: int,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float = 2.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One HTTP request to <task>:<port> from inside the task's own namespace (its loopback)."""
        result: dict[str, Any] = {}

        def fetch() -> None:
            try:
                _enter_netns(self.hosts[key].netns)
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
                try:
                    connection.request(method, path, body=body, headers=headers or {})
                    response = connection.getresponse()
                    result["value"] = (response.status, response.read())
                finally:
                    connection.close()
            except BaseException as err:  # re-raised in the caller's thread
                result["error"] = err

        thread = threading.Thread(target=fetch, name=f"netns-{method.lower()}-{key}", daemon=True)
        thread.start()
        thread.join(timeout + 5)
        if "error" in result:
            raise result["error"]
        if "value" not in result:
            raise TimeoutError(f"{method} {path} in {key} did not finish")
        status, response_body = result["value"]
        return int(status), bytes(response_body)

    def destroy(self) -> None:
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_ETC_DIR / name, ignore_errors=True)
        self._created.clear()


def _enter_netns(name: str) -> None:
    """Move the calling thread (only it) into a named network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_RUN_DIR / name, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def remove_stale(prefix: str) -> None:
    """Delete namespaces left by earlier runs of this kit whose process is gone (pst<pid>-...)."""
    if not NETNS_RUN_DIR.is_dir():
        return
    for entry in NETNS_RUN_DIR.iterdir():
        name = entry.name
        if not name.startswith(prefix):
            continue
        owner = name[len(prefix) :].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_ETC_DIR / name, ignore_errors=True)
