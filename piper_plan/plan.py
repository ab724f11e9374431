"""plan.json: a versioned, self-contained description of one training layout.

It embeds the model and hardware specs (with a hash of each), the degrees, the rank map,
the layer -> stage partition, micro-batching, routing assumption and predicted metrics,
so the runtime needs nothing else. Writes are atomic (temp file + os.replace)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import __version__
from .errors import SpecError, from_validation
from .layout import Layout, RankCoord
from .specs.hardware import HardwareSpec
from .specs.model import ModelSpec

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Routing(_Strict):
    """Assumed token -> expert distribution: uniform, Zipf(s) over experts, or a measured
    histogram (tokens per expert, one list per MoE layer or one for all)."""

    distribution: Literal["uniform", "zipf", "histogram"] = "uniform"
    zipf_s: float = Field(1.0, ge=0)
    histogram: Optional[list[list[float]]] = None


class Migration(_Strict):
    enabled: bool = False
    period_steps: int = Field(50, ge=1, description="re-plan placement every K optimizer steps")
    threshold: float = Field(1.1, ge=1.0, description="... or when max/mean rank load passes this")
    planner: Literal["swap", "lpt"] = "lpt"
    window: int = Field(20, ge=1, description="moving-average window of per-expert loads, steps")
    max_moves: Optional[int] = Field(None, ge=0, description="cap on experts moved per migration")


class Predicted(_Strict):
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    fits: bool
    a2a_time_s: float = 0.0
    memory_gib_per_stage: list[dict] = Field(default_factory=list)
    time_breakdown_s: dict[str, float] = Field(default_factory=dict)


class Plan(_Strict):
    schema_version: int = SCHEMA_VERSION
    created_by: str = f"piper-plan {__version__}"
    model: ModelSpec
    model_hash: str
    hardware: HardwareSpec
    hardware_hash: str
    layout: Layout
    partition: list[list[int]] = Field(..., description="model chunk -> layer indices (pp*vpp chunks)")
    rank_map: list[RankCoord]
    routing: Routing = Routing()
    migration: Migration = Migration()
    predicted: Optional[Predicted] = None

    def chunk_stage_rank(self, chunk: int) -> int:
        """Pipeline rank that runs model chunk `chunk`: looped for interleaved/1f1b/gpipe
        (chunk c on rank c % pp), V-shaped for zbv/dualpipev (0..pp-1 then back)."""
        pp = self.layout.pp
        if self.layout.schedule in ("zbv", "dualpipev"):
            return chunk if chunk < pp else 2 * pp - 1 - chunk
        return chunk % pp


def spec_hash(spec: BaseModel) -> str:
    """sha256 of the canonical JSON of a spec (first 16 hex digits)."""
    blob = json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write via a temp file in the same folder and os.replace: a failed write leaves the old file whole.
    The file keeps the mode of the one it replaces, else gets what open() would give it (0666 less
    the umask; mkstemp's own 0600 would hide a plan or spec from the other users of a machine)."""
    p = Path(path)
    try:
        mode = p.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent or ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_plan(plan: Plan, path: str | os.PathLike) -> None:
    atomic_write_text(path, plan.model_dump_json(indent=2) + "\n")


def read_plan(path: str | os.PathLike) -> Plan:
    """Load and validate plan.json; any problem is a one-line SpecError."""
    src = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise SpecError(src, "<file>", f"cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise SpecError(src, f"line {e.lineno}", f"malformed JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise SpecError(src, "<root>", "expected a JSON object")
    ver = data.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise SpecError(src, "schema_version", f"expected {SCHEMA_VERSION}, got {ver!r}")
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        raise from_validation(src, e) from None
    if spec_hash(plan.model) != plan.model_hash:
        raise SpecError(src, "model_hash", "does not match the embedded model spec (edited by hand?)")
    if spec_hash(plan.hardware) != plan.hardware_hash:
        raise SpecError(src, "hardware_hash", "does not match the embedded hardware spec (edited by hand?)")
    if len(plan.rank_map) != plan.layout.gpus:
        raise SpecError(src, "rank_map", f"expected {plan.layout.gpus} entries, got {len(plan.rank_map)}")
    if len(plan.partition) != plan.layout.stages:
        raise SpecError(src, "partition", f"expected {plan.layout.stages} chunks, got {len(plan.partition)}")
    return plan


def json_schema() -> dict:
    return Plan.model_json_schema()


def make_plan_from(model: ModelSpec, hardware: HardwareSpec, layout: Layout, partition: list[list[int]], *,
                   routing: Routing | None = None, migration: Migration | None = None,
                   predicted: Predicted | None = None) -> Plan:
    """Assemble a Plan from a given layer partition."""
    from .layout import rank_coords

    return Plan(model=model, model_hash=spec_hash(model), hardware=hardware, hardware_hash=spec_hash(hardware),
                layout=layout, partition=partition, rank_map=rank_coords(layout, hardware.gpus_per_node),
                routing=routing or Routing(), migration=migration or Migration(), predicted=predicted)


def make_plan(model: ModelSpec, hardware: HardwareSpec, layout: Layout, *, layer_cost=None,
              first_extra: float = 0.0, last_extra: float = 0.0, routing: Routing | None = None,
              migration: Migration | None = None, predicted: Predicted | None = None) -> Plan:
    """Assemble a Plan. `layer_cost` (shape [L], seconds) balances the partition; without
    it layers weigh by their active parameters (a proxy for their time)."""
    from .layout import check_layout
    from .partition import balanced_partition

    check_layout(layout, model.num_layers, model.moe.num_experts if model.moe else 0,
                 expert_ffn=model.moe.expert_ffn_size if model.moe else 0)
    if layer_cost is None:
        act = model.moe_layer_nonexpert_params + (model.moe.top_k * model.expert_params if model.moe else 0)
        layer_cost = [act if model.layer_is_moe(i) else model.dense_layer_params for i in range(model.num_layers)]
    part = balanced_partition(layer_cost, layout.stages, first_extra, last_extra)
    return make_plan_from(model, hardware, layout, part, routing=routing, migration=migration, predicted=predicted)
