"""The bundled rows priced blind: what validate is worth on a table that states no recipe.

Every bundled row carries the recipe its source ran (dispatcher, EP overlap, CUDA graphs,
recompute modules, ...: validate_recipes.RECIPE) and the specs it is priced on. A table in the
published schema states neither, and the rows of such a table that matter most are those the
bundled table does not hold. So each bundled row is priced as such a row: its recipe and spec
columns blank (the specs then come from its model and hardware names, validate_rows), its
recipe inferred (validate_recipes.nearest_reference) from the bundled rows of OTHER setups only
(another model, system, precision, layout or recompute: its twins in other releases are left
out as well), and, for comparison, with no recipe at all. The report is the same summary
validate gives; nothing here changes what validate reports.
"""
from __future__ import annotations

from .validate import data_path, price_rows, spec_names
from .validate_recipes import RECIPE, inherit_recipes, setup
from .validate_rows import read_rows

SPEC_COLUMNS = ("model_spec", "hardware_spec")


def blind_rows(bundled: list[dict]) -> list[dict]:
    """Copies of the bundled rows with their recipe and spec columns blank."""
    return [{**r, **dict.fromkeys(RECIPE + SPEC_COLUMNS, "")} for r in bundled]


def blind_run(group: str | None = None, infer: bool = True):
    """(results, {row id: reference id}) for the bundled rows priced blind (module docstring),
    each row's recipe inferred from the other setups' rows, or none if not `infer`."""
    path, specs = data_path(), {}
    names = spec_names(specs, path)
    bundled = read_rows(path)
    rows = blind_rows(bundled)
    inherited = {}
    if infer:
        # a row's setup as it is priced blind, on the specs its names give: a row the bundled table
        # prices on a variant of its machine (frontier-rocm57, a release's regressed kernel) is
        # still the same setup as its twins on that machine, and stays out of their references
        setups = [setup(x, names(x)) for x in rows]  # once, not once per row
        for row, mine in zip(rows, setups):
            if group and row["group"] != group:
                continue
            others = [x for x, s in zip(bundled, setups) if s != mine]
            inherited.update(inherit_recipes([row], others, names))
    return price_rows(rows, path, specs, group, inherited=inherited), inherited
