"""Base classes of the spec models: strict (unknown keys are errors, instances frozen), and
strict with fields left out of the dump while they hold their neutral default."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_serializer


class _Strict(BaseModel):
    # strict: a string or a bool where a number belongs is an error, not a conversion ("64" -> 64,
    # true -> 1); no NaN or infinity in any float (a spec figure is a finite measurement)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class _Optional(_Strict):
    """A strict model whose `_OMIT_AT_DEFAULT` fields are left out of its dump while they
    hold their neutral default, so specs written before those fields existed dump (and
    hash, plan.spec_hash) exactly as they did."""

    _OMIT_AT_DEFAULT: tuple[str, ...] = ()

    @model_serializer(mode="wrap")
    def _omit(self, handler, info):
        d = handler(self)
        if (info.context or {}).get("defaults"):  # every field, defaults included (sweep.set_field)
            return d
        for k in self._OMIT_AT_DEFAULT:
            if k in d and getattr(self, k) == type(self).model_fields[k].get_default(call_default_factory=True):
                del d[k]
        return d
