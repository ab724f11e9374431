"""Expert-parallel dispatcher: route -> permute -> exchange counts -> exchange rows ->
grouped GEMM -> exchange back -> unpermute -> combine.

The row exchange is pluggable (FlatExchange, HaloExchange: see exchange_flat.py for the
interface). Counts cross the network once per layer: one small all_to_all_single of int64
on the same EP group carries, to each peer, the rows this rank sends to each of that
peer's slots followed by this rank's whole send-split vector (W values), so every rank
learns both its (source, slot) receive counts and the full W x W matrix of row counts.
The matrix (halo.Counts) goes to the dispatch exchange and its transpose to the combine,
so HALO's relays never exchange counts themselves (the flat exchange ignores them).

Rows travel in physical-expert order, so what a peer receives from each source is already
grouped by its local slot; one more local permutation makes the rows of each slot
contiguous for the grouped GEMM."""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist

from .. import timing
from .halo import Counts
from .permute import Pairs, combine, count, permute
from .placement import ExpertPlacement


class EPDispatcher:
    """Runs the routed experts of one MoE layer across an EP group of size `ep`.

    placement: logical -> (EP rank, slot) map; `ep_rank`: this rank's index in the group.
    exchange: row exchange (None when ep == 1). Statistics of the last step are kept in
    `tokens_per_expert` (logical, routed from this rank) and `tokens_per_slot` (rows this
    rank's experts computed), both int64 on the rows' device (read once a step), reset by
    the caller."""

    def __init__(self, placement: ExpertPlacement, ep_rank: int = 0, group=None, exchange=None):
        self.placement, self.ep_rank, self.group, self.exchange = placement, ep_rank, group, exchange
        self.ep = placement.ep
        if self.ep > 1 and exchange is None:
            raise ValueError("ep > 1 needs an exchange")
        self.set_placement(placement)
        self.a2a = timing.Acc()

    def set_placement(self, placement: ExpertPlacement) -> None:
        """Install a new map (all ranks of the group together, between steps)."""
        self.placement = placement
        self._phys = placement.physical_ids()
        E = placement.num_experts
        self.tokens_per_expert = torch.zeros(E, dtype=torch.long)
        self.tokens_per_slot = torch.zeros(placement.per_rank, dtype=torch.long)

    def reset_stats(self) -> None:
        self.tokens_per_expert.zero_()
        self.tokens_per_slot.zero_()
        self.a2a.reset()

    def __call__(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                 expert_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 compute_dtype: Optional[torch.dtype] = None, may_drop: bool = True) -> torch.Tensor:
        """x [N, d]; experts/weights [N, k] (id -1: dropped); expert_fn(rows, counts per
        slot) -> rows. Rows are cast to compute_dtype (default x.dtype) as they are
        gathered, so they also travel in it. Returns [N, d] = Σ_k weight · expert(x) in
        x.dtype, combined in fp32. may_drop False (a dropless router) skips the search for
        dropped ids, a host synchronisation on a GPU."""
        N, k = experts.shape
        E, per = self.placement.num_experts, self.placement.per_rank
        dev = x.device
        if self._phys.device != dev:
            self._phys = self._phys.to(dev)
            self.tokens_per_expert, self.tokens_per_slot = self.tokens_per_expert.to(dev), self.tokens_per_slot.to(dev)
        flat_e = experts.reshape(-1)
        src: Optional[torch.Tensor] = None  # kept (token, choice) positions; None: all
        if may_drop and bool((flat_e < 0).any()):
            src = (flat_e >= 0).nonzero().squeeze(1)
            flat_e = flat_e[src]
        p = self._phys[flat_e]
        order = torch.argsort(p, stable=True)
        src = order if src is None else src[order]                  # expert order -> (token, choice)
        counts = count(p, E)                                         # [E] by physical id
        if not timing.in_backward():
            self.tokens_per_expert += count(flat_e, E)
        pairs = Pairs.of(src, N, k)
        rows = permute(x, pairs, compute_dtype or x.dtype)          # [A, d]

        if self.ep == 1:
            y = expert_fn(rows, counts)
            slot_counts = counts
        else:
            W = self.ep
            # the count exchange is timed with the rows' (and the wait for the slowest peer at
            # it): the plan's all-to-all time prices both (cost/layer.py's call and its wait)
            rows = timing.start(rows, self.a2a)
            send_t = counts.view(W, per).sum(1)
            # to peer j: my rows for j's slots, then my whole send-split vector
            msg = torch.cat([counts.view(W, per), send_t.expand(W, W)], dim=1).contiguous()
            got_msg = torch.empty_like(msg)
            dist.all_to_all_single(got_msg, msg, group=self.group)          # row s: from source s
            recv_mat = got_msg[:, :per]                                      # (src, slot)
            mat = got_msg[:, per:].tolist()                                  # row s: s's send splits
            full = Counts(tuple(tuple(r) for r in mat))
            send_splits, recv_splits = full.send(self.ep_rank), full.recv(self.ep_rank)
            got = timing.end(self.exchange(rows, send_splits, recv_splits, counts=full), self.a2a)
            # (src, slot) order -> (slot, src) order so each slot's rows are contiguous
            slot_of_row = torch.arange(per, device=dev).repeat(W).repeat_interleave(
                recv_mat.reshape(-1), output_size=sum(recv_splits))
            by_slot = torch.argsort(slot_of_row, stable=True)
            slot_counts = recv_mat.sum(0)
            out_local = expert_fn(got.index_select(0, by_slot), slot_counts)
            back = torch.empty_like(by_slot)
            back[by_slot] = torch.arange(by_slot.numel(), device=dev)
            out_local = timing.start(out_local.index_select(0, back), self.a2a)
            y = timing.end(self.exchange(out_local, recv_splits, send_splits, counts=full.transposed()), self.a2a)
        if not timing.in_backward():
            self.tokens_per_slot += slot_counts
        return combine(y, pairs, weights, x.dtype)
