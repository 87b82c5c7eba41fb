"""`python -m psoperator.reference`: list the committed reference pages that differ from what the
code renders (exit 1 if any); `--write` writes them."""

from __future__ import annotations

import argparse
import sys

from psoperator.reference import ROOT
from psoperator.reference.pages import PAGES


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m psoperator.reference", description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the stale pages")
    args = parser.parse_args()
    stale = 0
    for relative, render in PAGES.items():
        path = ROOT / relative
        text = render()
        if path.exists() and path.read_text() == text:
            continue
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {relative}", file=sys.stderr)
        else:
            print(f"stale: {relative}", file=sys.stderr)
            stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
