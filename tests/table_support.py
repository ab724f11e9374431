"""What the validation-table tests share: a bundled table's rows, and a copy of rows written where
a test edits them (a column blanked, a cell made bad) for `piper-plan validate --table`."""
from __future__ import annotations

import csv
from pathlib import Path

from piper_plan import validate as V


def bundled_rows(name: str) -> list[dict]:
    """The rows of the bundled validation/<name>.csv."""
    with open(V.data_path().parent / f"{name}.csv", newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, rows, fieldnames=None) -> Path:
    """`rows` (dicts) written as a table at `path` under `fieldnames` (default: the first row's keys)."""
    rows = list(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fieldnames or rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path
