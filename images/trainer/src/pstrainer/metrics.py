"""Gauges and histograms in Prometheus's text format, without a client library.

The runtime installs into users' TensorFlow images and brings no dependency of its own; the chief
serves a handful of unlabelled families, which this writes in the format Prometheus scrapes
(version 0.0.4).
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    """A sample value as Go writes floats (Prometheus's own format): exponent from 1e21 down to 1e6."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    integer, dot, fraction = text.partition(".")
    digits = integer.lstrip("-")
    if "e" in text or not dot or len(digits) <= 6:
        return text
    mantissa = f"{digits[0]}.{digits[1:]}{fraction}".rstrip("0").rstrip(".")
    return f"{'-' if value < 0 else ''}{mantissa}e+{len(digits) - 1:02d}"


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    documentation: str


class Gauge:
    """A value set at will; unset, it is not exposed."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self._value: float | None = None

    def set(self, value: float) -> None:
        self._value = float(value)

    def lines(self) -> list[str]:
        return [] if self._value is None else [f"{self.family.name} {_number(self._value)}"]


class Histogram:
    """Observations counted in cumulative buckets, with their count and sum."""

    def __init__(self, family: Family, buckets: tuple[float, ...]) -> None:
        self.family = family
        self._bounds = (*sorted(buckets), math.inf)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self._bounds, value)] += 1
            self._sum += value

    def lines(self) -> list[str]:
        name, lines, total = self.family.name, [], 0
        with self._lock:
            for bound, count in zip(self._bounds, self._counts, strict=True):
                total += count
                lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {total}')
            lines += [f"{name}_count {total}", f"{name}_sum {_number(self._sum)}"]
        return lines


class Registry:
    """The families the chief serves at METRICS_PATH, in the order they were made."""

    def __init__(self) -> None:
        self._metrics: list[Gauge | Histogram] = []

    def gauge(self, name: str, documentation: str) -> Gauge:
        metric = Gauge(Family(name, "gauge", documentation))
        self._metrics.append(metric)
        return metric

    def histogram(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        metric = Histogram(Family(name, "histogram", documentation), buckets)
        self._metrics.append(metric)
        return metric

    def collect(self) -> list[Family]:
        return [metric.family for metric in self._metrics]

    def exposition(self) -> bytes:
        lines: list[str] = []
        for metric in self._metrics:
            family = metric.family
            lines += [f"# HELP {family.name} {family.documentation}", f"# TYPE {family.name} {family.type}"]
            lines += metric.lines()
        return ("\n".join(lines) + "\n").encode()
