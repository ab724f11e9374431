"""Find and load model / hardware specs: bundled names, YAML paths, or HF config.json.

Bundled YAML lives in the repository's models/ and hardware/ folders, installed as the
package data `piper_plan.bundled.models|hardware`, so a plain wheel install finds them."""
from __future__ import annotations

import difflib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import SpecError, from_validation
from ..files import parse_json, read_text
from .hardware import HardwareSpec
from .model import ModelSpec

T = TypeVar("T", bound=BaseModel)
_REPO = Path(__file__).resolve().parents[2]


def bundled_dir(kind: str, pattern: str = "*.yaml") -> Path:
    """Where the bundled files of a kind ("models", "hardware": YAML specs; "validation": the
    measured tables) are: installed package data (wheel) first, else the repository folder
    (source checkout)."""
    p = Path(__file__).resolve().parents[1] / "bundled" / kind
    if p.is_dir() and any(p.glob(pattern)):
        return p
    return _REPO / kind


def validation_dir() -> Path:
    """The bundled measured tables (validation/: published.csv and the tables validate checks
    kernels against, track_record.json), installed as piper_plan.bundled.validation."""
    return bundled_dir("validation", "*.csv")


def bundled_names(kind: str) -> list[str]:
    """Names of the bundled specs of a kind ('models' or 'hardware'), sorted."""
    return sorted(p.stem for p in bundled_dir(kind).glob("*.yaml"))


def nearest_bundled(name: str, kind: str) -> str | None:
    """The bundled spec name closest to a misspelt one (difflib), or None where none is close."""
    close = difflib.get_close_matches(name, bundled_names(kind), n=1)
    return close[0] if close else None


def _bundled(ref: str, kind: str) -> Path | None:
    """The bundled spec file of that name, if there is one (a name too long for a file is none)."""
    q = bundled_dir(kind) / f"{ref}.yaml"
    return q if os.path.isfile(q) else None


def _known(kind: str) -> str:
    return f"known: {', '.join(bundled_names(kind))}"


_SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def _suffix(p: Path) -> str:
    """The file's suffix in lower case: x.JSON and x.Yaml are what x.json and x.yaml are."""
    return p.suffix.lower()


def _resolve(ref: str, kind: str) -> Path:
    try:
        return _resolve_file(ref, kind)
    except OSError as e:  # stat() refusing the name (ENAMETOOLONG, ELOOP, EACCES above it): one line, not a traceback
        raise SpecError(ref, "<file>", f"cannot read ({e.strerror or e})") from None


def _resolve_file(ref: str, kind: str) -> Path:
    p = Path(ref)
    q = _bundled(ref, kind)
    if p.is_dir() and q is not None and _suffix(p) not in _SPEC_SUFFIXES:
        return q  # a folder here named like a bundled spec (a downloaded snapshot) does not hide it
    if kind == "models" and p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"  # a Hugging Face snapshot's folder: its config.json
    if _suffix(p) in _SPEC_SUFFIXES or p.exists():
        if p.is_dir():
            raise SpecError(ref, "<file>", "is a folder; expected a spec YAML or a config.json file")
        if not p.is_file():  # a device or pipe exists, and is no spec file
            raise SpecError(ref, "<file>", "not a regular file; expected a spec YAML or a config.json file"
                            if p.exists() else "no such file")
        return p
    if q is not None:
        return q
    close = nearest_bundled(ref, kind)
    hint = f"did you mean {close}? " if close else ""
    raise SpecError(ref, "<name>", f"not a file and not a bundled {kind[:-1] if kind.endswith('s') else kind} "
                                   f"({hint}{_known(kind)})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated in one mapping: YAML itself lets the last one
    win, which silently drops the first figure (and the source written beside it)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:  # the keys as written: a merge key (<<: *anchor) may be overridden
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads 3.35e3, 5e1 and 1e-06 as strings (its floats need a dot and a signed
# exponent); YAML 1.2 and JSON read them as numbers, and so do users writing a spec
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))


def _unique_keys(source: str):
    """json.loads object_pairs_hook that refuses a key repeated in one object (JSON lets the last win)."""

    def hook(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise SpecError(source, k, "appears twice in one JSON object")
            out[k] = v
        return out

    return hook


def read_yaml(path: Path) -> dict:
    """A YAML mapping, loaded safely (SafeLoader, repeated keys refused); a syntax error becomes a one-line
    SpecError."""
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.reader.ReaderError as e:  # a control character: its str() is two lines, without a problem_mark
        line = text.count("\n", 0, e.position) + 1
        raise SpecError(str(path), f"line {line}", f"malformed YAML (character #x{e.character:04x}: {e.reason}; "
                                                   "YAML allows no control characters)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "<yaml>"
        why = " ".join(str(getattr(e, "problem", None) or e).split())  # one line, whatever the error's str() holds
        raise SpecError(str(path), where, f"malformed YAML ({why})") from None
    except (ValueError, TypeError, OverflowError) as e:  # a value its tag cannot hold: a date 2024-13-45, !!int abc
        raise SpecError(str(path), "<yaml>", f"a value YAML cannot read ({e})") from None
    except RecursionError:
        raise SpecError(str(path), "<yaml>", "nested too deep to be a spec") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "<root>", "expected a mapping of fields")
    return data


def parse(cls: type[T], data: dict, source: str) -> T:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise from_validation(source, e) from None


def hf_config(path: Path) -> dict | None:
    """The parsed Hugging Face config where `path` holds one, else None (a YAML spec). A .json file
    (any case) is one; a .yaml / .yml never is; a file of another or no suffix is one where its text
    is a JSON object with model_type or architectures (a Piper spec has neither field). A config never
    goes through the YAML reader, which refuses valid JSON indented by tabs."""
    suffix = _suffix(path)
    if suffix in (".yaml", ".yml"):
        return None
    text = read_text(path)
    if suffix != ".json":
        try:
            sniffed = json.loads(text)
        except (ValueError, RecursionError):
            return None  # not JSON: a YAML spec without its suffix
        if not (isinstance(sniffed, dict) and ("model_type" in sniffed or "architectures" in sniffed)):
            return None
    return parse_json(text, str(path), _unique_keys(str(path)))  # again: a repeated key is refused


def load_model(ref: str) -> ModelSpec:
    """A bundled model name, a model YAML, or a Hugging Face config.json (hf_config)."""
    path = _resolve(ref, "models")
    cfg = hf_config(path)
    if cfg is not None:
        from .hf import model_from_hf_config

        _refuse_plan(path, cfg)
        return model_from_hf_config(cfg, str(path))
    data = read_yaml(path)
    _refuse_plan(path, data)
    if _hardware_keys(data):
        raise SpecError(str(path), "accelerator" if "accelerator" in data else "network",
                        "this is a hardware spec, not a model: pass it as the hardware (-H)")
    if "name" not in data and ("model_type" in data or "architectures" in data):
        raise SpecError(str(path), "model_type", "this is a Hugging Face config.json read as a model YAML: give "
                        "the file a .json suffix (config.json)")
    return parse(ModelSpec, _with_base(path, data, (), "models"), str(path))


def _refuse_plan(path: Path, data) -> None:
    """A plan.json given as a spec (it holds both, with its layout): one line saying what it is."""
    if isinstance(data, dict) and {"schema_version", "layout", "model", "hardware"} <= data.keys():
        raise SpecError(str(path), "schema_version", "this is a plan.json, not a spec: render it with piper-plan show")


def _hardware_keys(data: dict) -> bool:
    """Whether a spec's fields are a hardware spec's: an accelerator, or a network without a model's
    layers (a hardware spec missing its accelerator is still one, and says that field is missing)."""
    return "accelerator" in data or ("network" in data and "num_layers" not in data)


def load_hardware(ref: str) -> HardwareSpec:
    """A bundled hardware name or a hardware YAML; a YAML with `base:` (a bundled name or a path
    beside it) is that spec with the YAML's fields laid over it (_with_base)."""
    path = _resolve(ref, "hardware")
    data = read_yaml(path)
    _refuse_plan(path, data)
    if "num_layers" in data or "model_type" in data:
        raise SpecError(str(path), "num_layers" if "num_layers" in data else "model_type",
                        "this is a model spec, not hardware: pass it as the model (-m)")
    return parse(HardwareSpec, _with_base(path, data, (), "hardware"), str(path))


def _with_base(path: Path, data: dict, seen: tuple[str, ...], kind: str) -> dict:
    """`data` laid over the spec its `base:` names, mappings merged key by key and anything else
    replaced: a variant states only what differs (another software stack's measured plateaus on
    the same machine; a model with its multi-token-prediction module), so the figures and their
    sources live in one file. `kind`: "hardware" or "models", where bundled bases are found."""
    if "base" not in data:
        return data
    what = "hardware" if kind == "hardware" else "model"
    ref = data.pop("base")
    if not isinstance(ref, str) or not ref:
        raise SpecError(str(path), "base", f"expected the name or path of another {what} spec")
    base = _base_file(path, ref, kind)
    if base is None:
        raise SpecError(str(path), "base", f"{ref!r} is neither a YAML beside this file nor a bundled {what} "
                                           f"spec ({_known(kind)})")
    chain = seen + (str(path.resolve()),)
    if str(base.resolve()) in chain:
        raise SpecError(str(path), "base", f"{ref!r} leads back to this spec (a cycle of bases)")
    return _merged(_with_base(base, read_yaml(base), chain, kind), data)


def _base_file(path: Path, ref: str, kind: str) -> Path | None:
    """The spec a `base: ref` in `path` names: a YAML beside it, else a bundled spec of `kind`."""
    local = path.parent / ref
    return local if _suffix(local) in (".yaml", ".yml") and os.path.isfile(local) else _bundled(ref, kind)


def spec_files(ref: str, kind: str) -> list[Path]:
    """The files loading `ref` (a bundled name or a path) of `kind` reads: the spec and each
    `base:` under it; [] where `ref` names none (loading it reports why). An output must not
    land on any of them (files.check_outputs)."""
    try:
        path = _resolve(ref, kind)
    except SpecError:
        return []
    out = [path]
    while len(out) < 32:  # 32: a cycle of bases (load refuses it)
        try:  # a YAML spec whatever its name ends in, as the loaders read it: not a Hugging Face config
            if hf_config(path) is not None:
                break
            data = read_yaml(path)
        except SpecError:
            break
        ref = data.get("base") if isinstance(data, dict) else None
        path = _base_file(path, ref, kind) if isinstance(ref, str) and ref else None
        if path is None:
            break
        out.append(path)
    return out


def is_hardware_spec(path: Path) -> bool:
    """A YAML spec is hardware where it holds an accelerator or is a variant (`base:`) of one."""
    data, seen = read_yaml(path), set()
    while "accelerator" not in data and isinstance(data.get("base"), str) and path not in seen:
        seen.add(path)
        path = _base_file(path, data["base"], "hardware")
        if path is None:
            return False
        data = read_yaml(path)
    return _hardware_keys(data)


def _merged(under: dict, over: dict) -> dict:
    out = dict(under)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def device_tokens(name: str) -> set[str]:
    """Model-number tokens of a device name: words holding a letter and a digit, not a capacity
    ('NVIDIA H100 80GB HBM3' -> {'H100', 'HBM3'}; '8x H100 SXM' -> {'H100'}: a count is not one)."""
    name = re.sub(r"(?<![A-Za-z0-9])\d+\s*[x\u00d7]\s*(?=[A-Za-z])", " ", name)  # "8x", "8 x": how many, not which
    return {t for t in re.findall(r"[A-Z0-9]+", name.upper())
            if re.search(r"\d", t) and re.search(r"[A-Z]", t) and not t.endswith("GB")}


@lru_cache(maxsize=None)
def _accelerator_tokens(bundled: str) -> frozenset[str]:
    """device_tokens of a bundled hardware spec's accelerator, read once a process (empty where
    the spec does not load)."""
    try:
        return frozenset(device_tokens(load_hardware(bundled).accelerator.name))
    except SpecError:
        return frozenset()


def hardware_by_device(name: str) -> list[str]:
    """The bundled hardware specs whose accelerator shares the most model-number tokens
    (device_tokens) with a device name, sorted; [] where none shares one."""
    want, best, score = device_tokens(name), [], 0
    for n in bundled_names("hardware"):
        s = len(want & _accelerator_tokens(n))
        if s > score:
            best, score = [n], s
        elif s == score and s:
            best.append(n)
    return best
