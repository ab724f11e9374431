"""One-line user errors: every bad input names its file, field and what was expected."""
from __future__ import annotations

from pydantic import ValidationError


class PiperError(Exception):
    """An error the CLI prints as one line and exits 2 on (no traceback)."""

    exit_code = 2


class SpecError(PiperError):
    def __init__(self, source: str, field: str, expected: str):
        self.source, self.field, self.expected = source, field, expected
        super().__init__(f"{source}: {field}: {expected}")


class LayoutError(PiperError):
    """An impossible parallel layout; `constraint` names the rule that is broken."""

    def __init__(self, constraint: str, detail: str):
        self.constraint = constraint
        super().__init__(f"layout: {constraint}: {detail}")


def from_validation(source: str, err: ValidationError, names: dict[str, str] | None = None) -> SpecError:
    """First pydantic error as a SpecError naming the dotted field path, or what `names` calls
    it in the file it came from (a config.json's own key for a ModelSpec field)."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e.get("loc", ())) or "<root>"
    loc = (names or {}).get(loc, loc)
    kind = e.get("type", "")
    if kind == "extra_forbidden":
        expected = "unknown field (not part of the schema)"
    elif kind == "missing":
        expected = "required field is missing"
    else:
        got = e.get("input")
        msg = e.get("msg", "invalid value")
        if isinstance(got, (dict, list)) or got is None:
            expected = msg  # a whole-object check: the message names the fields
        else:
            # a numpy scalar as the number it is: np.float64(0.0) reads 0.0
            got_s = repr(got.item() if type(got).__module__ == "numpy" and hasattr(got, "item") else got)
            expected = f"{msg} (got {got_s[:37] + '...' if len(got_s) > 40 else got_s})"
    return SpecError(source, loc, expected)


def exception_chain(e: BaseException) -> list[BaseException]:
    """`e`, then what it was raised from or during (__cause__, else __context__), outermost
    first, each once (a cycle ends it)."""
    chain = [e]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and nxt not in chain:
        chain.append(nxt)
    return chain


def error_line(e: BaseException) -> str:
    """One line saying what failed: the innermost cause's type and first non-empty line (torch's
    pipelining wraps a stage's error as RuntimeError("\n [Stage 0] failed ..."), whose first line
    is empty), else the first non-empty line anywhere along the chain."""
    chain = exception_chain(e)
    for x in reversed(chain):
        line = next((ln.strip() for ln in str(x).splitlines() if ln.strip()), "")
        if line:
            return f"{type(x).__name__}: {line}"
    return type(chain[-1]).__name__
