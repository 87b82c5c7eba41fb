"""JSON objects mutated as the fuzzer's bytes say: the structure-aware half of the harnesses.

A harness starts from a seed object (a pod, a job, a status as the API shows them) and applies a
few edits the bytes choose: replace any value, delete a key or a list item, add a key, append an
item. New keys and strings come from the seeds' own vocabulary half of the time, so the fuzzer
reaches the values the code compares with ("DisruptionTarget", "True", "Failed") without guessing
them letter by letter. Values are what JSON from the API server can hold: no NaN, no lone
surrogates.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import atheris

Json = Any

INTERESTING_INTS = (0, 1, -1, 2, 255, 256, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1)
INTERESTING_STRINGS = (
    "",
    " ",
    "0",
    "-1",
    "007",
    "1e3",
    "\u00b2",  # a digit for str.isdigit, not for int()
    "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it
    "True",
    "null",
    "2026-11-29T12:00:00Z",
    "2026-11-29T12:00:00+01:00",
    "2026-11-29",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "2026-02-30T00:00:00Z",
    "a/b/c",
    "x" * 300,
)
MAX_DEPTH = 4


@dataclass(frozen=True)
class Vocabulary:
    """The keys and scalar values of the seeds, offered to the mutations."""

    keys: tuple[str, ...]
    scalars: tuple[Json, ...]

    @classmethod
    def of(cls, *seeds: Json) -> Vocabulary:
        keys: set[str] = set()
        scalars: list[Json] = []

        def walk(value: Json) -> None:
            if isinstance(value, dict):
                keys.update(value)
                for child in value.values():
                    walk(child)
            elif isinstance(value, list):
                for child in value:
                    walk(child)
            elif value not in scalars:
                scalars.append(value)

        for seed in seeds:
            walk(seed)
        return cls(tuple(sorted(keys)), tuple(scalars))


def pick(fdp: atheris.FuzzedDataProvider, choices: tuple[Any, ...] | list[Any]) -> Any:
    return choices[fdp.ConsumeIntInRange(0, len(choices) - 1)]


def text(fdp: atheris.FuzzedDataProvider, words: Vocabulary) -> str:
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return str(pick(fdp, INTERESTING_STRINGS))
    if kind == 1:
        strings = [s for s in words.scalars if isinstance(s, str)] or [""]
        return str(pick(fdp, strings))
    if kind == 2:
        return str(pick(fdp, words.keys or ("",)))
    return str(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 48)))


def value(fdp: atheris.FuzzedDataProvider, words: Vocabulary, depth: int = 0) -> Json:
    """Any JSON value, small."""
    kind = fdp.ConsumeIntInRange(0, 9 if depth < MAX_DEPTH else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return pick(fdp, INTERESTING_INTS)
    if kind == 3:
        return fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
    if kind == 4:
        return fdp.ConsumeRegularFloat()
    if kind == 5:
        return pick(fdp, words.scalars or (None,))
    if kind == 6:
        return text(fdp, words)
    if kind == 7:
        return [value(fdp, words, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {text(fdp, words): value(fdp, words, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def _places(root: Json) -> list[tuple[Json, Any]]:
    """Every (container, key) of the object, breadth first: each value but the root's."""
    places: list[tuple[Json, Any]] = []
    pending = [root]
    while pending:
        node = pending.pop(0)
        children = (
            node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        )
        for key, child in children:
            places.append((node, key))
            pending.append(child)
    return places


def _edit(root: Json, fdp: atheris.FuzzedDataProvider, words: Vocabulary) -> Json:
    places = _places(root)
    containers = [root] + [c[k] for c, k in places if isinstance(c[k], dict | list)]
    op = fdp.ConsumeIntInRange(0, 3)
    if op == 0 and places:  # replace a value
        container, key = pick(fdp, places)
        container[key] = value(fdp, words)
    elif op == 1 and places:  # delete a key or an item
        container, key = pick(fdp, places)
        del container[key]
    elif op == 2:  # add a key, or append an item (a copy of a sibling half of the time)
        container = pick(fdp, containers)
        if isinstance(container, dict):
            container[text(fdp, words)] = value(fdp, words)
        elif container and fdp.ConsumeBool():
            container.append(copy.deepcopy(pick(fdp, container)))
        else:
            container.append(value(fdp, words))
    elif op == 3 and places:  # a scalar of the seeds, in another place
        container, key = pick(fdp, places)
        container[key] = pick(fdp, words.scalars or (None,))
    return root


def mutated(seed: Json, fdp: atheris.FuzzedDataProvider, words: Vocabulary, most: int = 6) -> Json:
    """A copy of `seed` with up to `most` edits."""
    result = copy.deepcopy(seed)
    for _ in range(fdp.ConsumeIntInRange(0, most)):
        result = _edit(result, fdp, words)
    return result
