"""Argument checks the benchmarks share: a bad value is refused by argparse in one line naming the
option and what it expects (exit 2) before anything is measured, not as a traceback minutes in.
A helper module, not a benchmark."""
from __future__ import annotations

import argparse
import sys


def int_at_least(low: int):
    """An argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def comma_list(item):
    """An argparse type: a comma-separated, non-empty list, each item parsed by `item` (which
    raises argparse.ArgumentTypeError for a bad one)."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [item(p) for p in parts]

    return parse


def one_of(allowed):
    """An argparse type for comma_list items: one of `allowed` (kept as its string)."""
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(map(str, allowed))}, got {text!r}")
        return text

    return parse


def helper_only(name: str) -> None:
    """Refuse to run a helper module as a benchmark: one line, exit 2."""
    print(f"{name}: a helper module the benchmarks import, not a benchmark; nothing to run", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    helper_only("benchmarks/_args.py")
