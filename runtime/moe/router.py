"""Token-choice top-k router: softmax or sigmoid scores, balance and z losses, capacity.

Scores are computed in fp32 whatever the compute dtype (as Megatron and torchtitan do:
bf16 logits make the balance statistics noisy)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .permute import count


@dataclass
class RouterOut:
    weights: torch.Tensor          # [N, k] fp32 combine weights (0 where dropped)
    experts: torch.Tensor          # [N, k] long logical expert ids, -1 where dropped by capacity
    aux_loss: Optional[torch.Tensor]  # scalar, coefficients applied; None when both are 0
    aux_logged: Optional[torch.Tensor] = None  # its value over all stats_group ranks (detached)


class TopKRouter(nn.Module):
    """x[N, d] -> top-k logical experts per token.

    score: "softmax" (Mixtral, Switch) or "sigmoid" (DeepSeek-V3). norm_topk renormalises
    the k selected scores to sum to 1 (default: on for sigmoid, off for softmax).
    aux_coef: Switch/GShard balance loss  E · Σ_e f_e · P_e  (f_e: fraction of the N·k
    assignments routed to e, P_e: mean normalised score of e; arXiv 2101.03961 eq. 4).
    z_coef: ST-MoE router z-loss  mean(logsumexp(logits)²)  (arXiv 2202.08906 eq. 5).
    capacity_factor: None = dropless; else each expert takes at most
    ceil(cf · N·k / E) of this rank's assignments, in token order, the rest are dropped.
    stats_group: ranks that each route a share of the same tokens (the tp ranks of a stage):
    f_e, the token count and the z-loss mean are taken over the group (one all-reduce of
    2E+2 values), and aux_loss is this rank's share -- the group's sum is the loss over all
    its tokens, as Megatron-Core computes it with tp (its gradient reaches each rank's own
    scores only)."""

    def __init__(self, d: int, num_experts: int, top_k: int, score: str = "softmax",
                 norm_topk: Optional[bool] = None, aux_coef: float = 0.0, z_coef: float = 0.0,
                 capacity_factor: Optional[float] = None, stats_group=None):
        super().__init__()
        self.gate = nn.Linear(d, num_experts, bias=False)
        self.E, self.k, self.score = num_experts, top_k, score
        self.norm_topk = (score == "sigmoid") if norm_topk is None else norm_topk
        self.aux_coef, self.z_coef, self.capacity_factor = aux_coef, z_coef, capacity_factor
        self.stats_group = stats_group

    def forward(self, x: torch.Tensor) -> RouterOut:
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x.float(), self.gate.weight.float())
        probs = torch.sigmoid(logits) if self.score == "sigmoid" else torch.softmax(logits, dim=-1)
        top_w, top_e = torch.topk(probs, self.k, dim=-1)
        if self.norm_topk:
            top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20)
        aux, logged = None, None
        if self.aux_coef or self.z_coef:
            counts = count(top_e.reshape(-1), self.E).to(probs.dtype)
            p = probs if self.score == "softmax" else probs / probs.sum(-1, keepdim=True)
            p_sum = p.sum(0)
            lse2 = torch.logsumexp(logits, dim=-1).square().sum() if self.z_coef else p_sum.new_zeros(())
            n = p_sum.new_full((1,), float(probs.shape[0]))
            stats = torch.cat([counts, p_sum.detach(), lse2.detach().view(1), n])  # summed over the group
            if self.stats_group is not None:
                torch.distributed.all_reduce(stats, group=self.stats_group)
            counts, p_all, lse2_all, n_all = stats.split([self.E, self.E, 1, 1])
            f = counts / (n_all * self.k)
            if self.aux_coef:
                aux = self.aux_coef * self.E * (f * p_sum).sum() / n_all[0]
                logged = self.aux_coef * self.E * (f * p_all).sum() / n_all[0]
            if self.z_coef:
                z = self.z_coef * lse2 / n_all[0]
                aux = z if aux is None else aux + z
                zl = self.z_coef * lse2_all[0] / n_all[0]
                logged = zl if logged is None else logged + zl
        if self.capacity_factor is not None:
            top_w, top_e = self._apply_capacity(top_w, top_e)
        return RouterOut(top_w, top_e, aux, logged)

    def capacity(self, n_tokens: int) -> int:
        return math.ceil(self.capacity_factor * n_tokens * self.k / self.E)

    def _apply_capacity(self, w: torch.Tensor, e: torch.Tensor):
        """Keep, per expert, the first `capacity` assignments in (token, choice) order."""
        cap = self.capacity(e.shape[0])
        flat = e.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = count(flat, self.E)
        start = torch.cumsum(counts, 0) - counts
        pos_sorted = torch.arange(flat.numel(), device=flat.device) - start[flat[order]]
        pos = torch.empty_like(pos_sorted)
        pos[order] = pos_sorted
        keep = (pos < cap).view_as(e)
        return w * keep, torch.where(keep, e, torch.full_like(e, -1))
