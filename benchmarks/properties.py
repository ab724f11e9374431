"""Physical-invariant ("property") pass over the analytical cost model.

Each check prices a sample of the search's own layouts (search.enumerate_layouts) twice, once as
they are and once with one thing changed that physics says moves the step time or the memory one
way only (a larger global batch, a longer sequence, more recompute, an overlap switched on, one
more layer, a higher tp or ep degree, a higher ZeRO stage ...), and reports the layouts where the
model moves the other way. Not a test: a survey, run by hand:

    PYTHONPATH=. python benchmarks/properties.py [--n 4000] [--only name] [--show 3]

It prints, per check and model/hardware pair, the layouts compared, the violations, the worst
relative one and the smallest layouts among them (as layout strings), so each can be reduced.
The orderings that hold on every sampled layout are held by tests/test_cost_orderings.py.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import numpy as np

from piper_plan.cost.batch import SPLITS, LayoutBatch, rc_bits
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import in_flight
from piper_plan.errors import PiperError
from piper_plan.layout import check_for
from piper_plan.layout import Layout
from piper_plan.report import layout_str
from piper_plan.search import SearchSpace, default_global_batch, enumerate_layouts, round_batch
from piper_plan.specs import load_hardware, load_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _args import int_at_least  # noqa: E402

PAIRS = (("deepseek-v3", "dgx-h800", 256), ("deepseek-v3", "frontier", 1024), ("mixtral-8x7b", "frontier", 64),
         ("qwen3-235b-a22b", "gb200-nvl72", 256), ("gpt-oss-120b", "dgx-b200", 64), ("llama3-70b", "dgx-h100", 64))
RTOL = 1e-6  # relative slack: below this a difference is rounding
STATE = ("weights", "grads", "master", "optimizer")


def base_layouts(m, hw, gpus: int, n: int, seed: int = 0, **space) -> LayoutBatch:
    """A seeded sample of `n` of the search's layouts for `gpus` GPUs (every schedule, recompute,
    ZeRO stage, all-to-all and placement it tries), at the model's sequence length."""
    seq = space.pop("seq", m.seq_len)
    sp = SearchSpace(gpus=gpus, seq=seq, global_batch=round_batch(default_global_batch(seq), gpus),
                     a2as=("flat", "halo", "dedup"), **space)
    batch, _ = enumerate_layouts(m, hw, sp)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(batch), size=min(n, len(batch)), replace=False))
    return batch.take(idx)


def vary(lay: LayoutBatch, **cols) -> LayoutBatch:
    """`lay` with the named columns set (a scalar or an array per layout)."""
    return replace(lay, **{k: np.broadcast_to(np.asarray(v, dtype=getattr(lay, k).dtype), (len(lay),)).copy()
                           for k, v in cols.items()})


def legal(m, hw, lay: LayoutBatch) -> np.ndarray:
    """Which layouts pass the layout rules (layout.check_for) one by one."""
    ok = np.zeros(len(lay), bool)
    for i in range(len(lay)):
        try:
            check_for(lay.layout(i), m, hw)
            ok[i] = True
        except PiperError:
            pass
    return ok


def show(lay: Layout) -> str:
    """A layout string with its batch, sequence and every field off its default."""
    d = lay.model_dump()
    extra = [f"{k}={v}" for k, v in d.items() if k in Layout.model_fields and k not in _SHOWN
             and v != Layout.model_fields[k].default]
    return f"{layout_str(d)} gbs{lay.global_batch} seq{lay.seq} " + " ".join(extra)


_SHOWN = ("gpus", "tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs", "global_batch", "seq", "schedule", "recompute",
          "recompute_modules", "recompute_layers", "zero", "zero_replicas", "a2a", "placement", "sequence_parallel")


def per_seq(e, lay):
    return e.step_time_s / lay.gbs


def per_token(e, lay):
    return e.step_time_s / (lay.gbs * lay.seq)


def peak(e, lay):
    return e.peak_memory_gib


def state(e, lay):
    """The largest parameter + optimizer state of a rank (GiB), over the pipeline's roles a layout
    has: a role with no stage (stage_of_role -1, the middle ranks at pp 2) is left out, as the
    estimate's own peak leaves it (its phantom figures had read as a tp x2 violation)."""
    per_role = [np.where(e.stage_of_role[r] >= 0, sum(c[k] for k in STATE), 0.0) for r, c in e.memory.items()]
    return np.max(np.stack(per_role), axis=0)


def step(e, lay):
    return e.step_time_s


class Survey:
    def __init__(self, show: int):
        self.show, self.rows = show, []

    def compare(self, name, pair, m, hw, a, b, metric, m_b=None, hw_b=None, expect="<=", rtol=RTOL):
        """Price `a` and `b` (b's model m_b, hardware hw_b where given) and count where
        metric(b) breaks `metric(a) <= metric(b)` (expect '<='), '>=' or '=='."""
        ok = legal(m, hw, a) & legal(m_b or m, hw_b or hw, b)
        a, b = a.take(ok), b.take(ok)
        if len(a) == 0:
            self.rows.append((name, pair, 0, 0, 0.0))
            return
        ea, eb_ = evaluate(m, hw, a), evaluate(m_b or m, hw_b or hw, b)
        x, y = metric(ea, a), metric(eb_, b)
        rel = (y - x) / np.maximum(np.abs(x), 1e-30)
        bad = {"<=": rel < -rtol, ">=": rel > rtol, "==": np.abs(rel) > rtol}[expect]
        worst = float(np.max(np.abs(rel[bad]))) if bad.any() else 0.0
        self.rows.append((name, pair, len(a), int(bad.sum()), worst))
        print(f"{name:34s} {pair:34s} {len(a):6d} layouts  {int(bad.sum()):5d} bad  worst {worst:.2%}")
        for i in np.flatnonzero(bad)[np.argsort(-np.abs(rel[bad]))][: self.show]:
            print(f"    {rel[i]:+.3%}  {show(a.layout(i))}  ->  {show(b.layout(i))}")
            ta, tb = ea.row(i)["time_breakdown_s"], eb_.row(i)["time_breakdown_s"]
            print("      " + " ".join(f"{k}:{ta[k]:.4g}->{tb[k]:.4g}" for k in ta if abs(tb[k] - ta[k]) > 1e-12 * abs(ta["total"])))


def checks(sv: Survey, m, hw, pair: str, a: LayoutBatch, only: str | None):
    def run(name, *args, **kw):
        if only is None or only in name:
            sv.compare(name, pair, m, hw, *args, **kw)

    # 1. global batch: twice the micro-batches
    b = vary(a, gbs=2 * a.gbs)
    run("batch: time/seq", b, a, per_seq)  # per-seq time of the larger batch <= the smaller's
    # 1F1B family: in-flight micro-batches capped by the pipeline, not M, once M reaches the
    # schedule's warm-up (interleaved's first rank holds pp + (pp-1)/v > pp: memory.in_flight)
    fam = (a.sched >= 1) & np.all(in_flight(a, np.arange(2)[:, None] * (a.pp - 1)) == in_flight(b, np.arange(2)[:, None] * (b.pp - 1)), axis=0)
    run("batch: peak mem (1f1b family)", a.take(fam), b.take(fam), peak, expect="==")
    run("batch: peak mem (gpipe grows)", a.take(a.sched == 0), b.take(a.sched == 0), peak)
    # 2. sequence length: time per token never falls as seq grows, at the same tokens a micro-batch
    # and a step (at the same mbs, half the sequences a step is half the micro-batches: another
    # schedule, whose bubble and per-step costs move the other way, so no ordering holds there)
    even = a.mbs % 2 == 0
    a2 = a.take(even)
    run("seq x2, same tokens/mb, same tokens/step: time/token", a2,
        vary(a2, seq=2 * a2.seq, mbs=a2.mbs // 2, gbs=a2.gbs // 2),
        per_token)
    # 3. recompute: none <= selective <= full in time, the reverse in memory
    none, sel, full = (vary(a, recompute=r, rc_mods=rc_bits(("core_attn",)), rc_layers=0) for r in (0, 1, 2))
    run("recompute none<=sel: time", none, sel, step)
    run("recompute sel<=full: time", sel, full, step)
    run("recompute none>=sel: peak mem", sel, none, peak)
    run("recompute sel>=full: peak mem", full, sel, peak)
    for mods in (("moe",), ("moe_act",), ("layernorm",), ("mlp",), ("attn_block", "act_fc2"), ("mla_up_proj",),
                 ("shared_experts",), ("core_attn", "layernorm", "moe_act")):
        s = vary(a, recompute=1, rc_mods=rc_bits(mods), rc_layers=0)
        run(f"recompute none<=sel{mods}: time", none, s, step)
        run(f"recompute sel{mods}<=full: time", s, full, step)
        run(f"recompute sel{mods}>=full: mem", full, s, peak)
        run(f"recompute none>=sel{mods}: mem", s, none, peak)
    for k in (1, 2, 4):
        part = vary(a, recompute=2, rc_layers=k)
        run(f"recompute full({k})<=full: time", part, full, step)
        run(f"recompute none<=full({k}): time", none, part, step)
        run(f"recompute full({k})>=full: mem", full, part, peak)
    # 4. overlap switches: on never slower
    for col, off, on in (("a2a_overlap", False, True), ("tp_overlap", False, True), ("overlap", False, True),
                         ("attn_fp8", False, True), ("unfused", True, False)):
        run(f"switch {col}={on}: time", vary(a, **{col: on}), vary(a, **{col: off}), step)
    z3 = a.take(a.pp == 1)
    z3 = vary(z3, zero=3)
    run("zero3 reshard off: time", vary(z3, reshard=False), vary(z3, reshard=True), step)
    run("zero3 reshard off: mem", vary(z3, reshard=True), vary(z3, reshard=False), peak)
    for g in (1, 2, 4, 8, 16):  # a CUDA-graph scope replaces per-op launches with one
        run(f"cuda graph bit {g}: time", vary(a, graphs=g), vary(a, graphs=0), step)
    # all-to-all on one node: halo is flat there (no node to aggregate); dedup sends a token once
    # per destination rank rather than once per routed expert, so never more than flat
    onenode = a.take(a.ep * a.ep_stride <= hw.gpus_per_node)
    run("a2a halo on one node == flat: time", vary(onenode, a2a=0), vary(onenode, a2a=1), step, expect="==")
    run("a2a dedup on one node <= flat: time", vary(onenode, a2a=2), vary(onenode, a2a=0), step)
    # ZeRO: a higher stage never holds more
    for z in (0, 1):
        run(f"zero {z}->{z + 1}: peak mem", vary(a, zero=z + 1), vary(a, zero=z), peak)
    run("zero 2->3 (pp1): peak mem", vary(a.take(a.pp == 1), zero=3), vary(a.take(a.pp == 1), zero=2), peak)
    # hybrid sharding: twice the copies of each ZeRO shard (a shard over half the ranks) never hold less
    for z in (1, 2, 3):
        hz = vary(a if z < 3 else a.take(a.pp == 1), zero=z)
        run(f"zero {z} replicas x2: peak mem", hz, vary(hz, zrep=2 * hz.zrep), peak)
    # 6. memory vs degrees: doubling tp (2x GPUs) or ep never raises a rank's state
    run("tp x2: state mem", vary(a, tp=2 * a.tp, gpus=2 * a.gpus, sp=True), a, state)
    run("ep x2: state mem", vary(a, ep=2 * a.ep), a, state)
    run("pp x2: state mem", vary(a, pp=2 * a.pp, gpus=2 * a.gpus), a, state)
    # mbs: time/seq with more sequences per micro-batch at the same number of micro-batches
    run("mbs x2 same M: time/seq", vary(a, mbs=2 * a.mbs, gbs=2 * a.gbs), a, per_seq)


def model_checks(sv: Survey, m, hw, pair: str, a: LayoutBatch, only: str | None):
    """5. model size: one more layer, a wider hidden / FFN / expert never runs faster or holds less."""
    dump = m.model_dump()
    bigger = {"layers+1": {"num_layers": m.num_layers + 1},
              "ffn x1.5": {"ffn_size": m.ffn_size * 3 // 2} if m.ffn_size else None,
              "expert_ffn x2": {"moe": {**dump["moe"], "expert_ffn_size": 2 * m.moe.expert_ffn_size}} if m.moe else None,
              "hidden+heads*64": {"hidden_size": m.hidden_size + 64 * m.num_heads} if m.head_dim else None}
    for name, upd in bigger.items():
        if upd is None:
            continue
        m2 = type(m)(**{**dump, **upd})
        for what, metric in (("time", step), ("peak mem", peak)):
            if only is None or only in f"model {name}: {what}":
                sv.compare(f"model {name}: {what}", pair, m, hw, a, a, metric, m_b=m2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int_at_least(1), default=3000, help="layouts sampled per model/hardware pair")
    ap.add_argument("--only", help="only the checks whose name holds this")
    ap.add_argument("--show", type=int_at_least(0), default=2, help="worst violations printed per check")
    ap.add_argument("--pair", help="only the pairs whose 'model@hardware/gpus' holds this")
    ap.add_argument("--split", choices=("balanced", "even", "account"),
                    help="price every layout with this pipeline split (even: one that no cost moves)")
    args = ap.parse_args(argv)
    sv = Survey(args.show)
    for model, hwn, gpus in PAIRS:
        pair = f"{model}@{hwn}/{gpus}"
        if args.pair and args.pair not in pair:
            continue
        m, hw = load_model(model), load_hardware(hwn)
        a = base_layouts(m, hw, gpus, args.n)
        if args.split:
            a = vary(a, split=SPLITS.index(args.split))
        checks(sv, m, hw, pair, a, args.only)
        model_checks(sv, m, hw, pair, a, args.only)
    if not sv.rows:
        ap.error(f"no check ran: --pair {args.pair!r} / --only {args.only!r} match none")
    bad = [r for r in sv.rows if r[3]]
    print(f"\n{len(sv.rows)} checks, {sum(r[2] for r in sv.rows)} comparisons, {len(bad)} checks with violations")
    # a survey, not a test: it states no tolerance beyond RTOL's rounding (which every counted violation
    # exceeds), and validation/README.md lists the known violations as findings; the orderings that
    # must hold are asserted by tests/test_cost_orderings.py, so a violation here does not fail the run
    print("a survey: violations are findings to reduce, not failures (exit 0); "
          "tests/test_cost_orderings.py holds the orderings that must hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
