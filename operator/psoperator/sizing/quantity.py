"""Kubernetes memory quantities: parsed exactly, written back exactly, shown to people."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from psoperator.sizing.errors import SizingError

# Memory requests are rounded up to this step, so suggestions read as 12Gi, not 11.83Gi.
REQUEST_STEP_BYTES = 256 * 2**20

KiB, MiB, GiB = 2**10, 2**20, 2**30

# The grammar of k8s.io/apimachinery/pkg/api/resource: a signed decimal number, then a binary SI
# suffix (Ki..Ei), a decimal SI suffix (n, u, m, k, M..E) or a decimal exponent (e3, E-2).
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?\d+)|(?P<decimal>[numkMGTPE]))?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(quantity: str | int) -> Decimal:
    """Parses a Kubernetes quantity ("16Gi", "512M", "1e9", "250m") into its exact value."""
    if isinstance(quantity, bool):
        raise SizingError(f"not a quantity: {quantity!r}")
    if isinstance(quantity, int):
        return Decimal(quantity)
    match = _QUANTITY.fullmatch(quantity.strip()) if isinstance(quantity, str) else None
    if match is None:
        raise SizingError(
            f"not a Kubernetes quantity: {quantity!r} (expected e.g. 16Gi, 512M, 1e9 or 1073741824)"
        )
    number = Decimal(match["number"])
    if match["binary"]:
        return number * Decimal(1024) ** _BINARY[match["binary"]]
    if match["exponent"]:
        return number.scaleb(int(match["exponent"]))
    if match["decimal"]:
        return number.scaleb(_DECIMAL[match["decimal"]])
    return number


def parse_bytes(quantity: str | int) -> int:
    """A memory quantity in whole bytes, rounded up as Kubernetes does; must be positive."""
    value = parse_quantity(quantity)
    if value <= 0:
        raise SizingError(f"memory must be positive: {quantity!r}")
    return math.ceil(value)


def format_quantity(num_bytes: int) -> str:
    """The shortest exact binary quantity: 12Gi, 768Mi, 1536Ki or plain bytes."""
    for suffix, unit in (("Ti", 2**40), ("Gi", GiB), ("Mi", MiB), ("Ki", KiB)):
        if num_bytes % unit == 0 and num_bytes >= unit:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def human_bytes(num_bytes: int) -> str:
    """For people: 4.77 GiB (always binary units, like the requests)."""
    value = float(num_bytes)
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or suffix == "TiB":
            if suffix == "B":
                return f"{num_bytes} B"
            # Three significant digits, without .3g's exponent form between 1000 and 1023.
            return f"{value:.0f} {suffix}" if value >= 100 else f"{value:.3g} {suffix}"
        value /= 1024
    raise AssertionError("unreachable")


def round_up_request(num_bytes: int) -> int:
    return -(-num_bytes // REQUEST_STEP_BYTES) * REQUEST_STEP_BYTES
