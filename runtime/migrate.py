"""Expert migration: measure load per logical expert, re-place experts, move their state.

Per step (after the optimizer step, brief §4):
1. every rank's routed-token counts per logical expert (EPDispatcher.tokens_per_expert) are
   summed over the stage's data-parallel group -- all EP groups and their expert-data-
   parallel replicas of the stage -- so every rank holds the same counts; a moving average
   over the last `window` steps is the load;
2. every `period_steps` steps, or when a layer's max/mean rank load passes `threshold`,
   each MoE layer of the stage re-plans its placement with the plan's planner
   (piper_plan.placement: "swap" or "lpt"); identical inputs give identical placements on
   every rank. A layer moves only if the new placement lowers its max rank load by at
   least MIN_GAIN (re-placing for sampling noise would move state for nothing);
3. each moved expert's slot of every per-slot tensor -- weights, gradients where present,
   optimizer state of the weights' shape (Adam moments; an fp32 master copy where the
   optimizer keeps one) -- travels by P2P inside the EP group (batch_isend_irecv, one
   byte buffer per peer pair) into staging buffers;
4. with `verify`, a checksum per logical expert of all its state before and after
   (summed over the EP group) must agree; then all ranks of the stage vote, and only if
   every rank succeeded are the staged slots written and the new logical -> physical map
   installed in every dispatcher. Otherwise the previous placement stays in force and
   nothing was touched (a failed migration is reported, training goes on).

Experts that stay on their rank keep their slot, so committing only writes the arriving
experts into the slots the departing ones freed: no local permutation, staging memory is
the arriving experts alone."""
from __future__ import annotations

import importlib
import time
from collections import deque
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from piper_plan.errors import error_line
from piper_plan.placement import plan_placement, rank_loads

from .moe.layer import MoELayer
from .moe.placement import ExpertPlacement

MIN_GAIN = 0.01          # a layer moves only if its max rank load drops by >= 1 %
_CK_CHUNK = 1 << 20      # int32 words per checksum chunk: 2^31 · 1021 · 2^20 < 2^63
_CK_MOD = (1 << 61) - 1  # digests are kept below 2^61 so an all-reduced sum of one per entry fits int64
WEIGHTS = ("w1", "w3", "w2")


class LoadTracker:
    """Moving average of routed tokens per logical expert over the last `window` steps.

    push(counts [L, E] int, this step's stage-wide counts); mean() -> [L, E] float,
    tokens per step. Inputs identical on every rank give identical outputs."""

    def __init__(self, num_layers: int, num_experts: int, window: int):
        self.shape = (num_layers, num_experts)
        self.hist: deque = deque(maxlen=max(1, int(window)))

    def push(self, counts: np.ndarray) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != self.shape:
            raise ValueError(f"counts of shape {counts.shape}, expected {self.shape}")
        self.hist.append(counts)

    def mean(self) -> np.ndarray:
        if not self.hist:
            return np.zeros(self.shape)
        return np.mean(np.stack(self.hist), axis=0)


def stage_moe_layers(chunks) -> dict[int, MoELayer]:
    """This rank's MoE layers by global layer id (the same ids on every rank of a stage)."""
    out: dict[int, MoELayer] = {}
    for c in chunks.values():
        out.update(c.moe_layers())
    return dict(sorted(out.items()))


def expert_fields(moe: MoELayer, opt) -> list[tuple[str, torch.Tensor]]:
    """Every per-slot tensor of one MoE layer's routed experts on this rank, in a fixed
    order: per weight (w1, w3, w2) the weight, its gradient if present, and each optimizer
    state tensor of the weight's shape. Dim 0 is the slot. Ranks that exchange experts
    hold the same edp index, hence the same ZeRO ownership and the same list."""
    state = opt.opt.state if opt is not None else {}
    out = []
    for w in WEIGHTS:
        p = getattr(moe.experts, w, None)
        if p is None:
            continue
        out.append((w, p.data))
        if p.grad is not None:
            out.append((f"{w}.grad", p.grad))
        st = state.get(p, {}) if hasattr(state, "get") else {}
        for k in sorted(st):
            v = st[k]
            if torch.is_tensor(v) and v.shape == p.shape:
                out.append((f"{w}.{k}", v))
    return out


def checksum(t: torch.Tensor) -> int:
    """Position-weighted sum of a tensor's 32-bit words, exact (int64 per chunk, Python int
    across chunks), reduced mod 2^61 - 1: equal bytes give equal sums on any rank."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if b.numel() % 4:
        b = torch.cat([b, b.new_zeros(4 - b.numel() % 4)])
    words = b.view(torch.int32)
    total = 0
    for a in range(0, words.numel(), _CK_CHUNK):
        w = words[a:a + _CK_CHUNK].long()
        pos = torch.arange(a, a + w.numel(), device=w.device, dtype=torch.long) % 1021 + 1
        total += int((w * pos).sum())
    return total % _CK_MOD


def _combine(parts: list[int]) -> int:
    h = 0
    for c in parts:
        h = (h * 1_000_003 + c) % _CK_MOD
    return h


def expert_state_digest(chunks, opt) -> dict[str, int]:
    """{"layers.<l>.moe.experts.<e>": checksum of all its state on this rank} for this
    rank's local experts (tests gather it from all ranks and compare across migrations)."""
    out = {}
    for layer, moe in stage_moe_layers(chunks).items():
        d = moe.dispatcher
        fields = expert_fields(moe, opt)
        for s, e in enumerate(d.placement.local_experts(d.ep_rank)):
            out[f"layers.{layer}.moe.experts.{e}"] = _combine([checksum(f[s]) for _, f in fields])
    return out


class Migrator:
    """Load tracking and migration for the MoE layers of one rank's stage.

    cfg: plan.migration (period_steps, threshold, planner, window, max_moves); groups:
    runtime.mesh.Groups (ep: this EP group, dp: the whole stage); opt: DistOptimizer or
    None; verify: checksum every expert's state before and after each migration; fault:
    test hook called as fault(point, staged) at "transfer" (after the first transfer
    completes; staged None) and "staged" (all received, before verification; staged:
    (layer, field) -> new slot -> received tensor) -- raising there, or corrupting a staged
    tensor, simulates a failure part-way."""

    def __init__(self, cfg, groups, chunks, opt, verify: bool = True,
                 fault: Optional[Callable[[str], None]] = None):
        self.cfg, self.groups, self.opt, self.verify, self.fault = cfg, groups, opt, verify, fault
        self.layers = stage_moe_layers(chunks)
        self.chunks = chunks
        E = next(iter(self.layers.values())).dispatcher.placement.num_experts if self.layers else 0
        self.tracker = LoadTracker(len(self.layers), E, cfg.window)
        self.since = 0
        self.ep_ranks = dist.get_process_group_ranks(groups.ep) if groups.ep is not None else [dist.get_rank()]
        self.events: list[dict] = []
        if cfg.planner == "lpt":  # its relabelling imports scipy.optimize (0.5-0.7 s): now, not in a step
            importlib.import_module("scipy.optimize")

    @property
    def active(self) -> bool:
        return bool(self.layers) and len(self.ep_ranks) > 1

    # ---- load ----------------------------------------------------------------------------
    def gather_counts(self) -> np.ndarray:
        """This step's routed tokens per logical expert [L, E], summed over the stage."""
        dev = self.layers[next(iter(self.layers))].experts.w1.device  # the counts live there too
        t = torch.stack([m.dispatcher.tokens_per_expert.to(dev, torch.long) for m in self.layers.values()])
        # every rank of the stage routes its own tokens (its sequence shard under tp): sum over
        # the whole stage so every EP group and every tp slice plans from the same counts
        dist.all_reduce(t, group=self._stage_group())
        return t.cpu().numpy()

    def _stage_group(self):
        return self.groups.stage if getattr(self.groups, "stage", None) is not None else self.groups.dp

    def plan(self, loads: np.ndarray, force: bool) -> dict[int, ExpertPlacement]:
        """New placements of the layers worth moving (identical on every rank)."""
        out = {}
        for i, (layer, moe) in enumerate(self.layers.items()):
            cur = moe.dispatcher.placement
            load = loads[i]
            if load.sum() <= 0:
                continue
            before = rank_loads(load, cur.as_lists())
            if not force and before.max() <= self.cfg.threshold * before.mean():
                continue
            target = plan_placement(load, cur.as_lists(), self.cfg.planner, self.cfg.max_moves)
            if rank_loads(load, target).max() <= before.max() * (1.0 - MIN_GAIN):
                out[layer] = cur.rebalanced(target)
        return out

    def after_step(self, step: int) -> Optional[dict]:
        """Collective over the stage: record this step's load; re-plan and migrate when due.
        Call after the optimizer step, before the dispatchers' statistics are reset.
        Returns the migration event (also kept in self.events) or None."""
        if not self.active:
            return None
        self.tracker.push(self.gather_counts())
        self.since += 1
        due = self.since >= self.cfg.period_steps
        t0 = time.perf_counter()
        loads = self.tracker.mean()
        targets = self.plan(loads, force=due)
        plan_s = time.perf_counter() - t0
        if due:
            self.since = 0
        if not targets:
            return None
        ev = self.migrate(targets)
        ev.update(step=step, plan_s=plan_s, trigger="period" if due else "threshold")
        for i, layer in enumerate(self.layers):
            if layer in targets:
                ev.setdefault("max_over_mean", {})[str(layer)] = [
                    float(rank_loads(loads[i], pl.as_lists()).max() / (loads[i].sum() / len(self.ep_ranks)))
                    for pl in (ev["_old"][layer], targets[layer])]
        del ev["_old"]
        if ev["ok"]:
            self.since = 0
        self.events.append(ev)
        return ev

    # ---- moving state --------------------------------------------------------------------
    def migrate(self, targets: dict[int, ExpertPlacement]) -> dict:
        """Move every expert whose rank changes to its new (rank, slot) and install the new
        maps -- or, if anything fails on any rank, change nothing. Collective over the stage."""
        t0 = time.perf_counter()
        me = self.groups.ep_rank
        old = {layer: self.layers[layer].dispatcher.placement for layer in targets}
        fields = {layer: expert_fields(self.layers[layer], self.opt) for layer in targets}
        moves = {layer: old[layer].moves_to(targets[layer]) for layer in targets}
        ok, err = True, None
        staged: dict[tuple[int, int], dict[int, torch.Tensor]] = {}  # (layer, field) -> new slot -> tensor
        digest, cache = None, {}
        works, send, recv = [], {}, {}
        try:
            digest = self._digests(targets, fields, old, None, cache) if self.verify else None
            send, recv = self._layout(targets, fields, moves, me)
            if self.fault:
                self.fault("planned", None)
        except Exception as e:  # noqa: BLE001 -- said to the peers below, before anyone posts a transfer
            ok, err = False, error_line(e)
        # every rank agrees to transfer before any posts one: a rank that failed above posts none,
        # and its peers' sends and receives to it would wait out the collective timeout
        ready = torch.tensor([1 if ok else 0], dtype=torch.long, device=self._device())
        dist.all_reduce(ready, op=dist.ReduceOp.MIN, group=self.groups.ep)
        if ok and not int(ready.item()):
            ok, err = False, "a peer in the EP group failed before the transfer"
        if ok:
            try:
                ops, rbufs = [], {}
                for peer in sorted(set(send) | set(recv)):
                    g = self.ep_ranks[peer]
                    if peer in send:
                        buf = torch.cat([t.reshape(-1).view(torch.uint8) for t in send[peer]])
                        ops.append(dist.P2POp(dist.isend, buf, g, self.groups.ep))
                    if peer in recv:
                        rbufs[peer] = torch.empty(sum(n for *_, n in recv[peer]), dtype=torch.uint8,
                                                  device=self._device())
                        ops.append(dist.P2POp(dist.irecv, rbufs[peer], g, self.groups.ep))
                works = dist.batch_isend_irecv(ops) if ops else []
                while works:
                    works.pop(0).wait()  # popped first: a failed wait is not waited on again
                    if self.fault and not staged and len(works) == len(ops) - 1:
                        self.fault("transfer", None)
                for peer, items in recv.items():
                    a = 0
                    for layer, fi, slot, like, n in items:
                        got = rbufs[peer][a:a + n].view(like.dtype).view(like.shape)
                        staged.setdefault((layer, fi), {})[slot] = got
                        a += n
                if self.fault:
                    self.fault("staged", staged)
                if self.verify:
                    digest = (digest, self._digests(targets, fields, old, staged, cache))
            except Exception as e:  # noqa: BLE001 -- any failure aborts the migration on every rank
                ok, err = False, error_line(e)
                for w in works:  # let every other posted transfer finish so the group stays usable
                    try:
                        w.wait()
                    except Exception:  # noqa: BLE001
                        pass
        if self.verify:  # before/after checksums of every logical expert, and failures, over the EP group
            L, E = len(targets), old[next(iter(old))].num_experts
            pair = torch.zeros(2 * L * E + 1, dtype=torch.long)
            if ok:
                pair[:L * E], pair[L * E:-1] = digest[0].reshape(-1), digest[1].reshape(-1)
            pair[-1] = 0 if ok else 1
            pair = pair.to(self._device())
            dist.all_reduce(pair, group=self.groups.ep)
            if ok and int(pair[-1]):
                ok, err = False, "a peer in the EP group failed"
            elif ok and not torch.equal(pair[:L * E], pair[L * E:-1]):
                ok, err = False, "checksum of expert state changed across the transfer"
        vote = torch.tensor([1 if ok else 0], dtype=torch.long, device=self._device())
        dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=self._stage_group())
        committed = bool(vote.item())
        if committed:
            with torch.no_grad():
                for (layer, fi), slots in staged.items():
                    t = fields[layer][fi][1]
                    for s, v in slots.items():
                        t[s].copy_(v)
            for layer, pl in targets.items():
                self.layers[layer].dispatcher.set_placement(pl)
        elif ok:
            err = "another rank of the stage failed"
        sent = sum(int(sum(t.numel() * t.element_size() for t in ts)) for ts in send.values()) if ok else 0
        return dict(ok=committed, error=None if committed else err, seconds=time.perf_counter() - t0,
                    layers=sorted(targets), moved={str(k): len(v) for k, v in moves.items()},
                    bytes_sent=sent, checksum=(f"{int(pair[:L * E].sum()) % _CK_MOD:016x}" if self.verify and committed
                                               else None), _old=old)

    def _device(self):
        return next(iter(self.layers.values())).experts.w1.device

    def _layout(self, targets, fields, moves, me):
        """send: peer -> tensors in order; recv: peer -> (layer, field, new slot, like, bytes)."""
        send: dict[int, list[torch.Tensor]] = {}
        recv: dict[int, list[tuple]] = {}
        for layer in sorted(targets):
            for e, ro, so, rn, sn in moves[layer]:
                for fi, (_, t) in enumerate(fields[layer]):
                    if ro == me:
                        send.setdefault(rn, []).append(t[so])
                    if rn == me:
                        like = t[sn]
                        recv.setdefault(ro, []).append((layer, fi, sn, like, like.numel() * like.element_size()))
        return send, recv

    def _digests(self, targets, fields, old, staged, cache: dict) -> torch.Tensor:
        """[L, E] checksum of every local logical expert: under the old placement (staged
        None) or as it will be after the commit (stayers' slots plus staged arrivals).
        cache: (layer, field, slot) -> checksum of a local slot, shared by both calls."""
        me = self.groups.ep_rank
        E = old[next(iter(old))].num_experts
        out = torch.zeros(len(targets), E, dtype=torch.long)
        for i, layer in enumerate(sorted(targets)):
            pl = old[layer] if staged is None else targets[layer]
            for s, e in enumerate(pl.local_experts(me)):
                parts = []
                for fi, (_, t) in enumerate(fields[layer]):
                    arrived = staged is not None and old[layer].rank_of[e] != me
                    if arrived:
                        parts.append(checksum(staged[(layer, fi)][s]))
                    else:
                        key = (layer, fi, s)
                        if key not in cache:
                            cache[key] = checksum(t[s])
                        parts.append(cache[key])
                out[i, e] = _combine(parts)
        return out


# ---- what a checkpoint keeps of it -------------------------------------------------------
def stage_state(chunks, mig: Optional[Migrator]) -> dict[str, dict]:
    """This rank's MoE layers, by layer id: where each logical expert lives (ep, rank_of,
    slot_of) and, while a Migrator runs, its load window (loads: oldest first, [E] routed
    tokens per step each) and the steps since its last period. A resumed run needs all of it
    to place and move experts as the uninterrupted run would (the weights are stored per
    logical expert, so they load under any placement)."""
    out = {}
    for i, (layer, moe) in enumerate(stage_moe_layers(chunks).items()):
        pl = moe.dispatcher.placement
        st = dict(ep=pl.ep, rank_of=list(pl.rank_of), slot_of=list(pl.slot_of))
        if mig is not None and mig.active:
            st.update(loads=[h[i].tolist() for h in mig.tracker.hist], since=mig.since)
        out[str(layer)] = st
    return out


def restore_placements(chunks, saved: dict[str, dict]) -> list[int]:
    """Install the saved placement of every local MoE layer whose EP degree and expert count
    are the run's (another layout keeps the contiguous one). Before the weights load: the
    slots they load into follow the placement. Returns the layers restored."""
    done = []
    for layer, moe in stage_moe_layers(chunks).items():
        st, d = saved.get(str(layer)), moe.dispatcher
        if st and st["ep"] == d.placement.ep and len(st["rank_of"]) == d.placement.num_experts:
            d.set_placement(ExpertPlacement(d.placement.num_experts, d.placement.ep,
                                            list(st["rank_of"]), list(st["slot_of"])))
            done.append(layer)
    return done


def restore_window(mig: Migrator, saved: dict[str, dict]) -> bool:
    """Refill the Migrator's load window and period count from a checkpoint, where every
    layer of its stage was saved with a window of the same length (else it starts empty)."""
    sts = [saved.get(str(layer)) for layer in mig.layers]
    if not mig.active or not all(st and st.get("loads") is not None for st in sts):  # saved without migration
        return False
    E = mig.tracker.shape[1]
    n = {len(st["loads"]) for st in sts}
    if len(n) != 1 or any(len(row) != E for st in sts for row in st["loads"]):
        return False
    for j in range(n.pop()):
        mig.tracker.push(np.array([st["loads"][j] for st in sts], dtype=np.int64))
    mig.since = int(sts[0]["since"])
    return True
