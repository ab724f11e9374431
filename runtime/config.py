"""Run options of piper-train that are not in the plan (torch-free, so the CLI starts fast)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from piper_plan.errors import PiperError
from piper_plan.runtimes import tp_refusal


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




def check_tp(plan, source: str = "plan") -> None:
    """The even splits tensor parallelism needs (runtime/tp.py; runtimes.tp_refusal), as one-line
    PiperErrors naming `source` (the plan's file)."""
    why = tp_refusal(plan.layout, plan.model)
    if why:
        raise PiperError(f"{source}: {why}")
