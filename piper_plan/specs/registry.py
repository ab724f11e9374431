"""Find and load model / hardware specs: bundled names, YAML paths, or HF config.json.

Bundled YAML lives in the repository's models/ and hardware/ folders, installed as the
package data `piper_plan.bundled.models|hardware`, so a plain wheel install finds them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import SpecError, from_validation
from .hardware import HardwareSpec
from .model import ModelSpec

T = TypeVar("T", bound=BaseModel)
_REPO = Path(__file__).resolve().parents[2]


def _bundled_dir(kind: str) -> Path:
    """Installed package data (wheel) first, else the repository folder (source checkout)."""
    p = Path(__file__).resolve().parents[1] / "bundled" / kind
    if p.is_dir() and any(p.glob("*.yaml")):
        return p
    return _REPO / kind


def bundled_names(kind: str) -> list[str]:
    """Names of the bundled specs of a kind ('models' or 'hardware'), sorted."""
    return sorted(p.stem for p in _bundled_dir(kind).glob("*.yaml"))


def _resolve(ref: str, kind: str) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.is_file():
            raise SpecError(ref, "<file>", "no such file")
        return p
    q = _bundled_dir(kind) / f"{ref}.yaml"
    if q.is_file():
        return q
    raise SpecError(ref, "<name>", f"not a file and not a bundled {kind[:-1] if kind.endswith('s') else kind} "
                                   f"(known: {', '.join(bundled_names(kind))})")


def read_yaml(path: Path) -> dict:
    """safe_load a YAML mapping; a syntax error becomes a one-line SpecError."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "<yaml>"
        raise SpecError(str(path), where, f"malformed YAML ({getattr(e, 'problem', None) or e})") from None
    except OSError as e:
        raise SpecError(str(path), "<file>", f"cannot read ({e.strerror})") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "<root>", "expected a mapping of fields")
    return data


def parse(cls: type[T], data: dict, source: str) -> T:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise from_validation(source, e) from None


def load_model(ref: str) -> ModelSpec:
    """A bundled model name, a model YAML, or a Hugging Face config.json."""
    path = _resolve(ref, "models")
    if path.suffix == ".json":
        from .hf import model_from_hf_config

        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise SpecError(str(path), f"line {e.lineno}", f"malformed JSON ({e.msg})") from None
        return model_from_hf_config(cfg, str(path))
    return parse(ModelSpec, read_yaml(path), str(path))


def load_hardware(ref: str) -> HardwareSpec:
    path = _resolve(ref, "hardware")
    return parse(HardwareSpec, read_yaml(path), str(path))
