"""Expert migration under skewed routing on 8 local ranks: what re-placing experts buys.

One command:  python benchmarks/migration.py  [--steps-before 24] [--steps-after 24] [--drift-steps 18]

One spawn of 8 CPU ranks (gloo, pp1 × dp8 × ep8, ZeRO-1, fp32) trains a 2-layer MoE sized
so the routed experts dominate (16 experts, d 128, expert width 512, top-2; inline below).
Routing is forced: a forward hook on every router replaces its top-k choices with k
independent draws from a popularity vector p -- Zipf(s) over the experts, in the
planner's own fixed popularity order (piper_plan.cost.imbalance.expert_popularity), so the
planner's Zipf(s) model describes the routing exactly. Runs:
- static skew s = 1.0 and s = 1.5, each with the paper's swap planner and with ours (LPT +
  local search): `steps-before` steps on the contiguous placement, one migration (due at
  the period), `steps-after` steps on the new placement;
- drift: p moves from one Zipf(1.0) order to another (linear mix over the middle third of
  the run); without migration, and with the runtime's own policy (threshold 1.1, window 4).

Measured per step: max/mean of the rows each rank computes (per MoE layer, averaged), the
lower bound max(heaviest expert, mean rank)/mean from the measured per-expert tokens, and
the MoE-layer time = Σ over MoE layers of (max over ranks of forward) + (max over ranks of
backward) of each rank's MoE block (router to combine), timed in the rank's own thread CPU
time. Why CPU time: 8 ranks share this machine's 2 cores, so a straggler's wall time is
hidden (the ranks waiting in the all-to-all sleep and hand it their core); on dedicated
devices the layer ends when its busiest rank does, which this figure measures. Wall step
time is printed too. Migration time is rank 0's wall time of the migration (transfers,
checksums, vote); its share of training time is taken at the default period
(plan.Migration().period_steps) against the measured wall step time after migration.

The planner's predictions beside them: piper_plan.cost.migration.predict_imbalance
(placement, with and without the planner), combined with the sampling factor as the cost
model combines them (imbalance.combined: their excesses over 1 in quadrature);
MoE-layer time from piper_plan.cost.compute.moe_phase (hardware cpu-local) at those
imbalances; migration seconds from migration_overhead."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from piper_plan.cost.imbalance import combined, expert_popularity, sampling_factor
from piper_plan.cost.migration import migration_overhead, predict_imbalance, predict_moe_layer_time
from piper_plan.layout import Layout
from piper_plan.plan import Migration, make_plan
from piper_plan.specs.model import ModelSpec
from piper_plan.specs.registry import load_hardware

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _args import int_at_least  # noqa: E402

RANKS = 8
MAX_AFTER_OVER_LB, MAX_SHARE, MAX_DROP_ERROR = 1.1, 0.05, 0.25  # the acceptance report() prints
SPEC = dict(name="migration-bench-cpu", source="Piper benchmark model (inline in benchmarks/migration.py)",
            num_layers=2, hidden_size=128, num_heads=2, vocab_size=256, seq_len=128, ffn_size=0, dense_layers=0,
            moe=dict(num_experts=16, top_k=2, expert_ffn_size=512, router="softmax"))
LAYOUT = dict(gpus=RANKS, pp=1, dp=RANKS, ep=RANKS, mbs=4, global_batch=4 * RANKS, seq=128, zero=1, dtype="fp32")
DEFAULT_PERIOD = Migration().period_steps


def popularity(s: float, order_seed: int = 0) -> np.ndarray:
    """Zipf(s) in the planner's popularity order; order_seed > 0 shuffles it again (drift)."""
    p = expert_popularity(SPEC["moe"]["num_experts"], "zipf", s)
    if order_seed:
        p = p[np.random.default_rng(order_seed).permutation(len(p))]
    return p


def scenarios(a):
    B, A, D = a.steps_before, a.steps_after, a.drift_steps
    out = []
    for s in (1.0, 1.5):
        for planner in ("swap", "lpt"):
            out.append(dict(name=f"zipf{s}-{planner}", s=s, planner=planner, steps=B + A, drift=False,
                            migration=Migration(enabled=True, period_steps=B, threshold=1e9, planner=planner,
                                                window=B)))
    for planner in (None, "lpt"):
        out.append(dict(name=f"drift-{planner or 'none'}", s=1.0, planner=planner, steps=D, drift=True,
                        migration=Migration(enabled=planner is not None, planner=planner or "lpt", window=4)))
    return out


def p_at(sc, step: int) -> np.ndarray:
    if not sc["drift"]:
        return popularity(sc["s"])
    third = sc["steps"] / 3
    alpha = min(max((step - third) / third, 0.0), 1.0)
    return (1 - alpha) * popularity(sc["s"]) + alpha * popularity(sc["s"], order_seed=7)


# ---- rank side ---------------------------------------------------------------------------
def _markers():
    import torch

    class Start(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, acc):
            ctx.acc = acc
            acc["t0"] = time.thread_time()
            return x.detach()

        @staticmethod
        def backward(ctx, g):
            if ctx.acc.get("tb") is not None:
                ctx.acc["bwd"] += time.thread_time() - ctx.acc.pop("tb")
            return g, None

    class End(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, acc):
            ctx.acc = acc
            acc["fwd"] += time.thread_time() - acc["t0"]
            return x.detach()

        @staticmethod
        def backward(ctx, g):
            ctx.acc["tb"] = time.thread_time()
            return g, None

    return Start, End


def _instrument(chunks, state, rank):
    """Synthetic routing on every router; thread-CPU timers around every MoE block."""
    import torch

    from piper_runtime.migrate import stage_moe_layers

    Start, End = _markers()
    accs = {}
    for layer, moe in stage_moe_layers(chunks).items():
        acc = accs[layer] = {"fwd": 0.0, "bwd": 0.0}

        def route(mod, inp, out, layer=layer):
            N, k = out.experts.shape
            g = torch.Generator().manual_seed(1_000_003 * state["seed"] + 1009 * state["step"] + 31 * rank + layer)
            draws = torch.multinomial(state["p"], N * k, replacement=True, generator=g).view(N, k)
            return dataclasses.replace(out, experts=draws)

        moe.router.register_forward_hook(route)
        moe.register_forward_pre_hook(lambda mod, args, acc=acc: (Start.apply(args[0], acc),))
        moe.register_forward_hook(lambda mod, args, out, acc=acc: End.apply(out, acc))
    return accs


def _run(sc, plan, groups, rank, seed):
    import torch
    import torch.distributed as dist

    from piper_runtime import metrics
    from piper_runtime.config import TrainConfig
    from piper_runtime.data import make_source, rank_rows
    from piper_runtime.migrate import Migrator, stage_moe_layers
    from piper_runtime.optim import DistOptimizer
    from piper_runtime.pipeline import Pipeline, build_local_chunks
    from piper_runtime.train import build_ctx, lm_loss

    cfg = TrainConfig(timeout_s=120)
    chunks = build_local_chunks(plan, 0, build_ctx(plan, cfg, groups), seed, "cpu")
    pipe = Pipeline(plan, chunks, groups.pp, "cpu", lm_loss)
    named = [(n, p) for c in chunks.values() for n, p in c.named_parameters()]
    opt = DistOptimizer(named, groups, plan.layout.dp, plan.layout.zero, 3e-4, 0.1)
    state = {"seed": seed, "step": 0, "p": None}
    accs = _instrument(chunks, state, rank)
    mig = Migrator(plan.migration, groups, chunks, opt) if plan.migration.enabled else None
    source = make_source(plan.model.vocab_size, plan.layout.seq, seed)
    moe = stage_moe_layers(chunks)
    rows_out = []
    for step in range(sc["steps"]):
        state["step"], state["p"] = step, torch.tensor(p_at(sc, step), dtype=torch.float)
        rows = rank_rows(source.batch(step, plan.layout.global_batch), plan.layout.dp, groups.dp_rank)
        metrics.reset(chunks)
        for a in accs.values():
            a["fwd"] = a["bwd"] = 0.0
        opt.zero_grad()
        t0 = time.perf_counter()
        pipe.step(rows[:, :-1], rows[:, 1:])
        opt.reduce_grads()
        opt.clip(1.0)
        opt.step()
        wall = time.perf_counter() - t0
        mine = dict(wall=wall, cpu={str(k): (a["fwd"], a["bwd"]) for k, a in accs.items()},
                    rows={str(k): int(m.dispatcher.tokens_per_slot.sum()) for k, m in moe.items()},
                    experts={str(k): m.dispatcher.tokens_per_expert.tolist() for k, m in moe.items()})
        ev = mig.after_step(step) if mig is not None else None
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, mine)
        if rank == 0:
            rows_out.append(dict(step=step, ranks=got, migration=ev))
    return rows_out


def _worker(rank, store, out_path, scs, seed):
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    from piper_runtime.mesh import build_groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, RANKS), rank=rank, world_size=RANKS,
                            timeout=timedelta(seconds=300))
    try:
        res = {}
        groups = None
        for sc in scs:
            plan = _plan(sc["migration"])
            if groups is None:
                groups = build_groups(plan, 300)
            res[sc["name"]] = _run(sc, plan, groups, rank, seed)
            dist.barrier()
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(res, f)
    finally:
        dist.destroy_process_group()


def _plan(migration):
    return make_plan(ModelSpec(**SPEC), load_hardware("cpu-local"), Layout(**LAYOUT), migration=migration)


# ---- analysis ----------------------------------------------------------------------------
def _step_figures(rec) -> dict:
    ranks = rec["ranks"]
    layers = sorted(ranks[0]["rows"])
    mm, lb = [], []
    for L in layers:
        r = np.array([x["rows"][L] for x in ranks], dtype=float)
        mm.append(r.max() / r.mean())
        e = np.sum([x["experts"][L] for x in ranks], axis=0).astype(float)
        lb.append(max(e.max(), e.sum() / RANKS) / (e.sum() / RANKS))
    moe_t = sum(max(x["cpu"][L][0] for x in ranks) + max(x["cpu"][L][1] for x in ranks) for L in layers)
    return dict(max_over_mean=float(np.mean(mm)), lower_bound=float(np.mean(lb)), moe_s=moe_t,
                wall_s=max(x["wall"] for x in ranks))


def _mean(rows, key):
    """Median over steps (robust to the shared machine's load spikes)."""
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def _predict(sc, model, hw, layout):
    p = popularity(sc["s"])
    mu = LAYOUT["mbs"] * LAYOUT["seq"] * SPEC["moe"]["top_k"]
    samp = float(sampling_factor(RANKS, mu))
    before, after = predict_imbalance(p, RANKS, None), predict_imbalance(p, RANKS, sc["planner"])
    tb = predict_moe_layer_time(model, hw, layout, float(combined(before["max_over_mean"], samp)))
    ta = predict_moe_layer_time(model, hw, layout, float(combined(after["max_over_mean"], samp)))
    mig = migration_overhead(model, hw, layout, DEFAULT_PERIOD, p=p, planner=sc["planner"])
    return dict(before=before["max_over_mean"], after=after["max_over_mean"], lb=after["lower_bound"],
                samp=samp, drop=1 - ta / tb, mig_s=mig["seconds_per_migration"], moved=after["moved"])


def planner_table() -> None:
    """Pure planners on larger groups (no training): where LPT + local search beats swaps."""
    print("\nplanners alone (Zipf popularity, contiguous start): max/mean rank load")
    print(f"{'E':>4} {'ep':>3} {'s':>4} {'none':>6} {'swap':>6} {'lpt':>6} {'LB':>6} {'slotLB':>6} "
          f"{'moved swap':>10} {'moved lpt':>9} {'lpt/LB':>6}")
    for E, ep in ((16, 8), (64, 8), (128, 32), (256, 64)):
        for s in (1.0, 1.5):
            p = expert_popularity(E, "zipf", s)
            r = {k: predict_imbalance(p, ep, k) for k in (None, "swap", "lpt")}
            print(f"{E:4d} {ep:3d} {s:4.1f} {r[None]['max_over_mean']:6.3f} {r['swap']['max_over_mean']:6.3f} "
                  f"{r['lpt']['max_over_mean']:6.3f} {r['lpt']['lower_bound']:6.3f} {r['lpt']['slot_lower_bound']:6.3f} "
                  f"{r['swap']['moved']:10d} {r['lpt']['moved']:9d} {r['lpt']['max_over_mean'] / r['lpt']['lower_bound']:6.3f}")


def report(res: dict, scs) -> dict:
    model, hw, layout = ModelSpec(**SPEC), load_hardware("cpu-local"), Layout(**LAYOUT)
    summary = {}
    print(f"\nmodel {SPEC['name']}: {SPEC['num_layers']} MoE layers, E={SPEC['moe']['num_experts']}, top-"
          f"{SPEC['moe']['top_k']}, d={SPEC['hidden_size']}, expert width {SPEC['moe']['expert_ffn_size']}; "
          f"{RANKS} ranks, EP {RANKS}, {LAYOUT['mbs'] * LAYOUT['seq']} tokens per rank per step")
    hdr = (f"{'run':14} {'max/mean':>17} {'LB':>6} {'after/LB':>8} {'MoE ms/step':>15} {'drop':>6} "
           f"{'wall ms':>13} {'moved':>5} {'mig ms':>7} {'share@' + str(DEFAULT_PERIOD):>9}")
    print("\nmeasured (before -> after; medians over steps, step 0 excluded)")
    print(hdr)
    for sc in scs:
        if sc["drift"]:
            continue
        rows = res[sc["name"]]
        figs = [_step_figures(r) for r in rows]
        B = sc["migration"].period_steps
        bef, aft = figs[1:B], figs[B:]
        ev = rows[B - 1]["migration"]
        assert ev and ev["ok"], f"{sc['name']}: the migration did not happen ({ev})"
        mb, ma = _mean(bef, "max_over_mean"), _mean(aft, "max_over_mean")
        lb = _mean(aft, "lower_bound")
        tb, ta = _mean(bef, "moe_s"), _mean(aft, "moe_s")
        wb, wa = _mean(bef, "wall_s"), _mean(aft, "wall_s")
        share = ev["seconds"] / (DEFAULT_PERIOD * wa + ev["seconds"])
        moved = sum(ev["moved"].values()) / max(len(ev["moved"]), 1)  # a MoE layer's, as the prediction counts
        pr = _predict(sc, model, hw, layout)
        summary[sc["name"]] = dict(before=mb, after=ma, lower_bound=lb, after_over_lb=ma / lb, moe_ms_before=tb * 1e3,
                                   moe_ms_after=ta * 1e3, drop=1 - ta / tb, wall_ms_before=wb * 1e3,
                                   wall_ms_after=wa * 1e3, moved=moved, migration_ms=ev["seconds"] * 1e3,
                                   share=share, predicted=pr)
        print(f"{sc['name']:14} {mb:7.3f} -> {ma:6.3f} {lb:6.3f} {ma / lb:8.3f} {tb * 1e3:6.1f} -> {ta * 1e3:6.1f}"
              f" {100 * (1 - ta / tb):5.1f}% {wb * 1e3:5.0f} -> {wa * 1e3:5.0f} {moved:5.1f} {ev['seconds'] * 1e3:7.1f}"
              f" {100 * share:8.2f}%")
    print("\nplanner's prediction (placement with sampling factor, imbalance.combined; MoE time from moe_phase "
          "on cpu-local)")
    print(f"{'run':14} {'placement':>17} {'x samp':>6} {'LB':>6} {'drop':>6} {'vs meas':>7} {'moved':>5} "
          f"{'mig ms':>7} {'share@' + str(DEFAULT_PERIOD):>9}")
    for name, s in summary.items():
        pr = s["predicted"]
        err = (pr["drop"] - s["drop"]) / s["drop"] if s["drop"] else float("nan")
        pshare = pr["mig_s"] / (DEFAULT_PERIOD * s["wall_ms_after"] / 1e3 + pr["mig_s"])
        s["predicted"].update(drop_error=err, share=pshare)
        print(f"{name:14} {pr['before']:7.3f} -> {pr['after']:6.3f} {pr['samp']:6.3f} {pr['lb']:6.3f} "
              f"{100 * pr['drop']:5.1f}% {100 * err:+6.1f}% {pr['moved']:5d} {pr['mig_s'] * 1e3:7.1f} {100 * pshare:8.2f}%")
    drift = {sc["name"]: [_step_figures(r) for r in res[sc["name"]]] for sc in scs if sc["drift"]}
    if drift:
        print("\ndrift: Zipf(1.0) order A -> order B over the middle third; max/mean per step (* = migration)")
        for name, figs in drift.items():
            evs = {r["step"] for r in res[name] if r["migration"] and r["migration"]["ok"]}
            print(f"{name:14} " + " ".join(f"{f['max_over_mean']:.2f}{'*' if i in evs else ' '}"
                                           for i, f in enumerate(figs)))
            summary[name] = dict(mean_max_over_mean=_mean(figs[1:], "max_over_mean"),
                                 mean_lower_bound=_mean(figs[1:], "lower_bound"),
                                 moe_ms=_mean(figs[1:], "moe_s") * 1e3, migrations=len(evs))
        for name in drift:
            s = summary[name]
            print(f"{name:14} mean max/mean {s['mean_max_over_mean']:.3f} (LB {s['mean_lower_bound']:.3f}), "
                  f"MoE {s['moe_ms']:.1f} ms/step, {s['migrations']} migrations")
    print("\nacceptance")
    for name, s in summary.items():
        if "predicted" in s:
            lb_ok = s["after_over_lb"] <= MAX_AFTER_OVER_LB
            print(f"{name:14} after/LB {s['after_over_lb']:.3f} (<= {MAX_AFTER_OVER_LB:g}: {lb_ok}); "
                  f"overhead {100 * s['share']:.2f}% (<= {100 * MAX_SHARE:g}%: {s['share'] <= MAX_SHARE}); MoE drop "
                  f"{100 * s['drop']:.1f}%; predicted drop within {100 * MAX_DROP_ERROR:g}%: "
                  f"{abs(s['predicted']['drop_error']) <= MAX_DROP_ERROR}")
    return summary


def failed_checks(summary: dict) -> list[str]:
    """The acceptance checks report() prints that a static-skew run fails, as phrases: placement
    after migration within 1.1x of the lower bound, migration overhead <= 5% of training at the
    default period, the predicted MoE-time drop within 25% of the measured (a NaN error, where
    nothing dropped, fails as it prints False)."""
    out = []
    for name, s in summary.items():
        if "predicted" not in s:  # the drift runs: reported, no acceptance
            continue
        if not s["after_over_lb"] <= MAX_AFTER_OVER_LB:
            out.append(f"{name} after/LB {s['after_over_lb']:.3f} > {MAX_AFTER_OVER_LB}")
        if not s["share"] <= MAX_SHARE:
            out.append(f"{name} overhead {100 * s['share']:.2f}% > {100 * MAX_SHARE:.0f}%")
        err = s["predicted"]["drop_error"]
        if not abs(err) <= MAX_DROP_ERROR:
            out.append(f"{name} predicted drop off by {100 * err:+.1f}% (beyond {100 * MAX_DROP_ERROR:.0f}%)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # step 0 is left out of the medians: a run needs one step more than it reports
    ap.add_argument("--steps-before", type=int_at_least(2), default=24)
    ap.add_argument("--steps-after", type=int_at_least(1), default=24)  # 24+24: the MoE time is noisy on shared cores
    ap.add_argument("--drift-steps", type=int_at_least(2), default=18)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the summary here")
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    scs = scenarios(a)
    with tempfile.TemporaryDirectory(prefix="piper-mig-") as tmp:
        out = os.path.join(tmp, "res.json")
        t0 = time.perf_counter()
        mp.spawn(_worker, args=(os.path.join(tmp, "store"), out, scs, a.seed), nprocs=RANKS, join=True)
        print(f"{len(scs)} runs on {RANKS} ranks in {time.perf_counter() - t0:.0f} s")
        with open(out) as f:
            res = json.load(f)
    summary = report(res, scs)
    planner_table()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    failed = failed_checks(summary)
    print(f"\nFAILED: {'; '.join(failed)}" if failed else "\nacceptance met")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
