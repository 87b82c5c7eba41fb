"""Coverage-guided fuzzing (atheris) of every input the operator parses: one harness per input.

Each harness is a module with `TestOneInput(data: bytes)`: it turns the fuzzer's bytes into the
input (the text itself, or a seed object mutated as the bytes say: mutate.py) and asserts what the
operator promises of it: no exception but the documented ones, values within the bounds the job's
status can keep, a round trip where there is one. `python -m tests.fuzz NAME --seconds N` runs one
(`__main__.py`); tests/unit/test_fuzz.py runs each for a fixed number of inputs.

Nothing is imported here: the runner instruments the code under test as the harness imports it.
"""

HARNESSES = (
    "progress_report",
    "checkpoint_answer",
    "checkpoint_request",
    "pods",
    "children",
    "tracking",
    "render",
)
