"""What must hold of everything the operator writes, whatever it read."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

# The API server keeps integers as 64-bit: a larger one in a status makes the write fail.
INT64 = range(-(2**63), 2**63)


def writable(obj: Any, where: str = "") -> None:
    """`obj` is JSON the API server takes: finite numbers, integers within 64 bits, string keys."""
    json.dumps(obj, allow_nan=False)
    if isinstance(obj, bool) or obj is None or isinstance(obj, str | float):
        return
    if isinstance(obj, int):
        assert obj in INT64, f"{where}: {obj} does not fit 64 bits"
    elif isinstance(obj, dict):
        for key, value in obj.items():
            assert isinstance(key, str), f"{where}: key {key!r}"
            writable(value, f"{where}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            writable(value, f"{where}[{i}]")
    else:
        raise AssertionError(f"{where}: {type(obj).__name__} is no JSON value")


def conforms(value: Any, hint: Any, where: str = "") -> None:
    """`value` is of the type `hint` says (the forms the views' dataclasses use), dataclasses field
    by field."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        problems = []
        for arm in args:
            try:
                conforms(value, arm, where)
                return
            except AssertionError as problem:
                problems.append(str(problem))
        raise AssertionError("; ".join(problems))
    if hint is type(None):
        assert value is None, f"{where}: {value!r} is not None"
    elif origin is dict:
        assert isinstance(value, dict), f"{where}: {value!r} is no dict"
        for key, item in value.items():
            conforms(key, args[0], f"{where} key")
            conforms(item, args[1], f"{where}[{key!r}]")
    elif origin is tuple:
        assert isinstance(value, tuple), f"{where}: {value!r} is no tuple"
        arms = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        assert len(arms) == len(value), f"{where}: {value!r} has {len(value)} items"
        for i, (item, arm) in enumerate(zip(value, arms, strict=True)):
            conforms(item, arm, f"{where}[{i}]")
    elif origin is list:
        assert isinstance(value, list), f"{where}: {value!r} is no list"
        for i, item in enumerate(value):
            conforms(item, args[0], f"{where}[{i}]")
    elif hint is Any:
        return
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        assert isinstance(value, hint), f"{where}: {value!r} is no {hint.__name__}"
        hints = typing.get_type_hints(hint)
        for field in dataclasses.fields(hint):
            conforms(getattr(value, field.name), hints[field.name], f"{where}.{field.name}")
    else:
        assert isinstance(value, hint), f"{where}: {value!r} is no {getattr(hint, '__name__', hint)}"
        if hint is int:
            assert not isinstance(value, bool), f"{where}: {value!r} is no int"
