"""Logical -> physical expert placement of one MoE layer inside one EP group.

A logical expert e (0..E-1, the id the router emits and the checkpoint stores) lives on
EP rank `rank_of[e]` in slot `slot_of[e]` of that rank's stacked expert weights. Every rank
of the EP group holds the same map; the dispatcher routes by it, so a migration only has to
change the map (and move the slot contents) on all ranks together."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ExpertPlacement:
    num_experts: int
    ep: int
    rank_of: list[int]
    slot_of: list[int]

    def __post_init__(self) -> None:
        E, ep = self.num_experts, self.ep
        if E % ep:
            raise ValueError(f"ep={ep} does not divide {E} experts")
        if len(self.rank_of) != E or len(self.slot_of) != E:
            raise ValueError("rank_of / slot_of need one entry per logical expert")
        seen = {(r, s) for r, s in zip(self.rank_of, self.slot_of)}
        full = {(r, s) for r in range(ep) for s in range(E // ep)}
        if seen != full:
            raise ValueError("placement must fill every (rank, slot) exactly once")

    @classmethod
    def contiguous(cls, num_experts: int, ep: int) -> "ExpertPlacement":
        """Expert e on rank e // (E/ep), slot e % (E/ep) (Megatron's and torchtitan's default)."""
        per = num_experts // ep if ep and num_experts % ep == 0 else 0
        if per == 0:
            raise ValueError(f"ep={ep} does not divide {num_experts} experts")
        return cls(num_experts, ep, [e // per for e in range(num_experts)], [e % per for e in range(num_experts)])

    @property
    def per_rank(self) -> int:
        return self.num_experts // self.ep

    def local_experts(self, ep_rank: int) -> list[int]:
        """Logical ids held by `ep_rank`, ordered by slot."""
        out = [0] * self.per_rank
        for e, (r, s) in enumerate(zip(self.rank_of, self.slot_of)):
            if r == ep_rank:
                out[s] = e
        return out

    def physical_ids(self, device=None) -> torch.Tensor:
        """LongTensor [E]: logical id -> rank * per_rank + slot (the order rows are sent in)."""
        return torch.tensor([r * self.per_rank + s for r, s in zip(self.rank_of, self.slot_of)],
                            dtype=torch.long, device=device)

    def as_lists(self) -> list[list[int]]:
        """Per-rank logical ids ordered by slot (the planners' placement form)."""
        return [self.local_experts(r) for r in range(self.ep)]

    def rebalanced(self, target: list[list[int]]) -> "ExpertPlacement":
        """The placement with rank sets `target` (ep lists of logical ids) that disturbs
        this one least: an expert that stays on its rank keeps its slot; arrivals fill the
        freed slots of their rank in ascending (logical id, slot) order."""
        if len(target) != self.ep or sorted(e for s in target for e in s) != list(range(self.num_experts)):
            raise ValueError("target must split all logical experts over the ep ranks")
        rank_of, slot_of = list(self.rank_of), list(self.slot_of)
        for r, ids in enumerate(target):
            if len(ids) != self.per_rank:
                raise ValueError(f"target rank {r} holds {len(ids)} experts, expected {self.per_rank}")
            stay = {e for e in ids if self.rank_of[e] == r}
            free = sorted(set(range(self.per_rank)) - {self.slot_of[e] for e in stay})
            for e, s in zip(sorted(set(ids) - stay), free):
                rank_of[e], slot_of[e] = r, s
        return ExpertPlacement(self.num_experts, self.ep, rank_of, slot_of)

    def moves_to(self, new: "ExpertPlacement") -> list[tuple[int, int, int, int, int]]:
        """(logical id, old rank, old slot, new rank, new slot) of every expert that changes
        rank, ascending by logical id (the order both ends of a transfer agree on)."""
        return [(e, self.rank_of[e], self.slot_of[e], new.rank_of[e], new.slot_of[e])
                for e in range(self.num_experts) if self.rank_of[e] != new.rank_of[e]]
