"""Small helpers shared by the e2e tests: polling with a deadline, objects as JSON, free ports, and
what to do when something a test needs cannot be had (where things are: e2e/paths.py)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import psutil
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")


def unavailable(reason: str) -> NoReturn:
    """What a test needs cannot be had: fail in CI (env CI set), where the suite must really run;
    skip on a workstation."""
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


class WaitTimeout(AssertionError):
    """A condition polled by `wait_for` did not hold before its deadline."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.2,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Polls `predicate` until it returns a truthy value, and returns that value.

    Exceptions raised by the predicate count as "not yet" (the API may be briefly unavailable);
    the last one is chained to the timeout error. `message` may be a callable so the error can
    describe the state observed at the deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except Exception as exc:  # any failure is retried until the deadline
            last_error = exc
        else:
            if value:
                return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for: {text}") from last_error
        time.sleep(min(interval, remaining))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def holds_for(
    predicate: Callable[[], object],
    duration: float,
    interval: float = 0.2,
    message: str | Callable[[], str] = "condition",
) -> None:
    """Asserts that `predicate` stays truthy during `duration` seconds (e.g. a failed pod stays failed)."""
    deadline = time.monotonic() + duration
    while True:
        if not predicate():
            text = message() if callable(message) else message
            raise AssertionError(f"stopped holding within {duration:.1f}s: {text}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(interval, remaining))


def as_json(api: client.ApiClient, obj: object) -> dict[str, Any]:
    """An API model as the JSON the API server sent (camelCase keys), easier to read in tests."""
    data: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


def get_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return as_json(api, client.CoreV1Api(api).read_namespaced_pod(name, namespace))


def get_pod_or_none(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return get_pod(api, namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def get_node(api: client.ApiClient, name: str) -> dict[str, Any]:
    return as_json(api, client.CoreV1Api(api).read_node(name))


def condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition of type `type_` in an object's status (a pod's, a node's, a job's), or None."""
    return next((dict(c) for c in (status or {}).get("conditions", []) if c.get("type") == type_), None)


def rss_mib(pid: int) -> float | None:
    """The resident memory of a process, in MiB; None once it is gone."""
    try:
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    except psutil.NoSuchProcess:
        return None
