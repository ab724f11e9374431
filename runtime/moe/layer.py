"""One MoE feed-forward layer: router, routed experts behind the EP dispatcher, shared experts.

With tensor parallelism the experts are folded over the stage's dp·tp ranks (expert tensor
parallelism 1), so each tp rank routes its own t/tp tokens: under sequence parallelism the
input already is the rank's sequence shard; without it the replicated tokens are split
over tp before routing and the combined output is all-gathered after. The shared experts
are a tensor-parallel FFN (layers.FFN) on the same input. The router's balance statistics
are summed over tp (router.stats_group); a capacity factor applies to each rank's t/tp
tokens, as it applies to each data-parallel rank's tokens.

The router's auxiliary losses are not returned through the pipeline (a stage passes one
hidden tensor on); instead their gradient is injected in backward where the layer's output
gradient arrives (Megatron's MoEAuxLossAutoScaler), scaled like the LM loss."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .. import timing
from ..tp import TP
from .dispatch import EPDispatcher
from .experts import GroupedExperts
from .router import TopKRouter


class _InjectAux(torch.autograd.Function):
    """Identity on `out`; backward also sends d(aux)/d(aux) = scale into the aux graph."""

    @staticmethod
    def forward(ctx, out, aux, scale: float):
        ctx.scale = scale
        ctx.save_for_backward(aux)
        return out.detach()  # not a view (see timing._End)

    @staticmethod
    def backward(ctx, g):
        (aux,) = ctx.saved_tensors
        return g, torch.full_like(aux, ctx.scale), None


class MoELayer(nn.Module):
    """x [B, S, d] -> [B, S, d].

    router: TopKRouter; experts: this rank's GroupedExperts (one slot per local expert);
    shared: dense FFN of all shared experts fused (width n_shared · f_shared) or None;
    dispatcher: EPDispatcher over the stage's EP group; aux_scale: gradient weight of the
    auxiliary losses (1 / micro-batches, like the LM loss)."""

    def __init__(self, router: TopKRouter, experts: GroupedExperts, shared: Optional[nn.Module],
                 dispatcher: EPDispatcher, aux_scale: float = 1.0, compute_dtype: torch.dtype = torch.float32,
                 tp: Optional[TP] = None):
        super().__init__()
        self.router, self.experts, self.shared = router, experts, shared
        self.dispatcher, self.aux_scale, self.compute_dtype = dispatcher, aux_scale, compute_dtype
        self.tp = tp or TP()
        self.aux_total = torch.zeros(())  # sum of auxiliary loss values this step (logging; no sync)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, d = x.shape
        tp = self.tp
        xf = x.reshape(B * S, d)
        split = tp.size > 1 and not tp.sp  # replicated tokens: each tp rank routes its share
        xr = tp.split_rows(xf) if split else xf
        r = self.router(xr)
        y = self.dispatcher(xr, r.experts, r.weights, self.experts, self.compute_dtype,
                            may_drop=self.router.capacity_factor is not None)
        if split:
            y = tp.gather_rows(y)
        if self.shared is not None:
            y = y + self.shared(x).reshape(B * S, d).to(y.dtype)
        y = y.view(B, S, d)
        if r.aux_loss is not None:
            # with tp, r.aux_logged is the tp group's whole value on every rank: count it once
            if not timing.in_backward() and tp.rank == 0:
                self.aux_total = self.aux_total.to(r.aux_loss.device) + r.aux_logged
            if y.requires_grad:
                y = _InjectAux.apply(y, r.aux_loss, self.aux_scale)
        return y
