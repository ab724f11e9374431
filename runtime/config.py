"""Run options of piper-train that are not in the plan (torch-free, so the CLI starts fast)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from piper_plan.errors import PiperError


@dataclass
class TrainConfig:
    """steps: total optimizer steps (a resumed run continues to it); lr: AdamW learning rate
    (constant); clip: global gradient-norm clip (0: off); aux_coef / z_coef: MoE balance and
    router z-loss coefficients; capacity_factor: None = dropless; timeout_s: collective
    timeout, seconds; grouped_mm: None = use grouped GEMM where it applies, False = loop."""

    steps: int = 10
    seed: int = 0
    lr: float = 3e-4
    weight_decay: float = 0.1
    clip: float = 1.0
    aux_coef: float = 1e-2
    z_coef: float = 0.0
    capacity_factor: Optional[float] = None
    metrics: Optional[str] = None
    checkpoint: Optional[str] = None
    checkpoint_every: int = 0          # 0: only at the end
    resume: bool = False
    data: Optional[str] = None
    data_dtype: Optional[str] = None
    log_every: int = 1                 # console line / live-view update every N steps; 0: silent
    timeout_s: float = 120.0
    grouped_mm: Optional[bool] = None


# the runtime's vocabulary rows (runtime/model.py): a multiple that keeps bf16 rows 16-byte aligned
# with room for the GEMM tiles, and that every power-of-two tp up to 64 divides, so the padded
# (logical) shape does not depend on the layout
VOCAB_MULTIPLE = 64


def padded_vocab(vocab_size: int) -> int:
    """Rows of the runtime's embedding and LM head: the vocabulary rounded up to VOCAB_MULTIPLE."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def check_tp(plan, source: str = "plan") -> None:
    """The even splits tensor parallelism needs (runtime/tp.py), as one-line PiperErrors naming
    `source` (the plan's file).
    tp is the fastest rank dimension; heads and kv heads are the planner's own rules."""
    lay, m = plan.layout, plan.model
    tp = lay.tp
    if tp == 1:
        return
    need = [("model.num_heads", m.num_heads), ("model.vocab_size (padded)", padded_vocab(m.vocab_size))]
    if not all(m.layer_is_moe(i) for i in range(m.num_layers)):
        need.append(("model.ffn_size", m.ffn_size))
    if m.moe is not None and m.moe.shared_experts:
        need.append(("model.moe shared expert width", m.moe.shared_experts * m.moe.shared_ffn))
    if lay.sp:
        need.append(("layout.seq (sequence parallelism)", lay.seq))
    elif m.moe is not None:
        need.append(("layout.mbs*seq (tokens split over tp before routing)", lay.mbs * lay.seq))
    for what, n in need:
        if n % tp:
            raise PiperError(f"{source}: {what}: {n} is not divisible by tp={tp}")
    kv = m.kv_heads
    if m.mla is None and kv % tp and tp % kv:
        raise PiperError(f"{source}: model.num_kv_heads: tp={tp} must divide the {kv} kv heads or be a multiple of them")
