"""piper-train's eager traffic on a GPU (cost/eager.py): its bytes per element reproduce the
runtime's own op-by-op count at shapes the coefficients were not solved on, and the planner
prices it only where nothing calibrated holds it already."""
import pytest
from benchmark_support import load_benchmark

from piper_plan.cost import eager
from piper_plan.cost.batch import from_layouts
from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model
from piper_plan.specs.model import ModelSpec

H200 = load_hardware("dgx-h200")


def _count(spec, t, moe, dtype):
    pytest.importorskip("torch")
    mod = load_benchmark("eager_bytes")
    r = mod.count_block(spec, t, moe=moe, dtype=dtype)
    fwd = r["forward_bytes"].get("elementwise", 0)
    return fwd, r["bytes"]["elementwise"] - fwd


def _token_bytes(spec, t, dtype, ph):
    """Bytes the token-level coefficients give one pass of t tokens at tp 1 (MLA's latents: t too)."""
    a, d = spec.mla, spec.hidden_size
    if a is None:
        return sum(k * x for k, x in zip(eager.TOKEN[dtype][ph], (t * d, t * spec.kv_heads * spec.hd, t)))
    qk, v = a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim
    elems = (t * d, t * spec.num_heads * qk, t * spec.num_heads * v, t * (a.kv_lora_rank + a.qk_rope_head_dim),
             t * (a.q_lora_rank or 0), t)
    return sum(k * x for k, x in zip(eager.MLA_TOKEN[dtype][ph], elems))


def _priced(spec, t, dtype):
    """Bytes the coefficients give one block pass of t tokens, forward and backward."""
    d = spec.hidden_size
    out = []
    for ph in ("f", "b"):
        n = _token_bytes(spec, t, dtype, ph)
        if spec.moe:
            mo, rows = spec.moe, t * spec.moe.top_k
            w, x, y, z, e = eager.MOE[dtype][ph]
            n += w * rows * d + x * rows * mo.expert_ffn_size + y * t * mo.num_experts + z * rows + e * t * d
        else:
            n += eager.FFN[dtype][ph][0] * t * spec.ffn_size
        out.append(n)
    return out


# shapes outside the solved set (t 152 / 176 tokens, 5 and 7 heads, MQA, 10 experts, top-3)
DENSE = ModelSpec(name="held-out-dense", num_layers=1, hidden_size=80, num_heads=5, num_kv_heads=5, vocab_size=256,
                  seq_len=152, ffn_size=224)
MOE = ModelSpec(name="held-out-moe", num_layers=1, hidden_size=112, num_heads=7, num_kv_heads=1, vocab_size=256,
                seq_len=176, ffn_size=0, moe=dict(num_experts=10, top_k=3, expert_ffn_size=72, router="softmax"))
# MLA at shapes outside benchmarks/eager_bytes.SOLVE_MLA (and its attention core counted as the
# kernel a GPU runs, not the CPU's math fallback for v heads narrower than q/k heads)
MLA = ModelSpec(name="held-out-mla", num_layers=1, hidden_size=144, num_heads=5, vocab_size=256, seq_len=184,
                ffn_size=400, mla=dict(q_lora_rank=56, kv_lora_rank=44, qk_nope_head_dim=36, qk_rope_head_dim=12,
                                       v_head_dim=28))
MLA_MOE = ModelSpec(name="held-out-mla-moe", num_layers=1, hidden_size=80, num_heads=3, vocab_size=256, seq_len=168,
                    ffn_size=0, moe=dict(num_experts=9, top_k=2, expert_ffn_size=56, router="softmax"),
                    mla=dict(kv_lora_rank=52, qk_nope_head_dim=28, qk_rope_head_dim=20, v_head_dim=36))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("spec", [DENSE, MOE, MLA, MLA_MOE], ids=lambda s: s.name)
def test_the_bytes_per_element_reproduce_the_runtime_s_own_count(spec, dtype):
    counted = _count(spec, spec.seq_len, spec.moe is not None, dtype)
    # bf16, piper-train's GPU dtype: within 3 %; fp32 (CPU tests' dtype) a MoE forward to 7 %
    tol = 0.03 if dtype == "bf16" else 0.08
    for got, want in zip(_priced(spec, spec.seq_len, dtype), counted):
        assert got == pytest.approx(want, rel=tol)


def test_only_unfused_layouts_on_a_spec_without_a_calibrated_block_overhead_pay_it():
    lay = from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=2048, fused_kernels=f) for f in (False, True)])
    assert eager.applies(H200, lay).tolist() == [True, False]
    cpu = load_hardware("cpu-local")  # calibrate's layer_overhead_us holds the eager cost there
    assert cpu.efficiency.layer_overhead_us and not eager.applies(cpu, lay).any()


def test_piper_train_s_eager_block_costs_a_gpu_more_than_the_fused_passes_it_replaces():
    m = load_model("qwen3-30b-a3b")
    base = dict(gpus=8, dp=8, ep=8, mbs=1, global_batch=8, seq=4096)
    fused = estimate_layout(m, H200, Layout(**base)).time["compute"][0]
    unfused = estimate_layout(m, H200, Layout(**base, fused_kernels=False)).time["compute"][0]
    assert unfused > 1.2 * fused


def test_the_bytes_per_element_are_what_the_benchmark_solves_for_today_s_runtime():
    # a change to piper-train's ops moves these: re-derive with `benchmarks/eager_bytes.py --solve`
    pytest.importorskip("torch")
    mod = load_benchmark("eager_bytes")
    solved = mod.solve("bf16")
    for ph in ("f", "b"):
        dense, moe = solved[("dense", ph)][0], solved[("moe", ph)][0]
        assert dense[:3] == pytest.approx(eager.TOKEN["bf16"][ph], rel=0.01)
        assert dense[3:] == pytest.approx(eager.FFN["bf16"][ph], rel=0.01)
        # the MoE block's own t·d coefficient less the dense block's: its token-level excess
        assert moe[3:] + [moe[0] - dense[0]] == pytest.approx(eager.MOE["bf16"][ph], rel=0.01, abs=0.5)
        mla = solved[("mla", ph)][0]
        assert mla[:6] == pytest.approx(eager.MLA_TOKEN["bf16"][ph], rel=0.01)
        assert mla[6:] == pytest.approx(eager.FFN["bf16"][ph], rel=0.01)  # its FFN is the dense block's
        for kind in ("mla", "mla_q"):
            assert solved[("ops", kind, ph)] == {eager.OPS["bf16"][kind][ph == "b"]}


def test_a_shared_expert_s_activation_is_priced_beside_the_routed_ones():
    from piper_plan.cost.compute import moe_phase

    m = load_model("deepseek-v2")  # two shared experts
    plain = m.model_copy(update={"moe": m.moe.model_copy(update={"shared_experts": 0})})
    lay = from_layouts([Layout(gpus=64, pp=4, dp=16, ep=16, mbs=1, global_batch=64, seq=4096, fused_kernels=f)
                        for f in (False, True)])

    def fb(spec):  # forward + backward seconds of the MoE block, unfused and fused
        ph = moe_phase(spec, H200, lay, "bf16", 1.0)
        return ph.f + ph.b
    # what the shared experts add: GEMMs in both; their activation as eager traffic unfused, as
    # one fused pass (of fewer bytes) fused (tests/test_moe_phase_terms.py counts those bytes)
    shared = fb(m) - fb(plain)
    width = m.moe.shared_experts * m.moe.shared_ffn
    f, b = eager.ffn_phase(m, H200, lay, width)
    assert 0.0 < shared[0] - shared[1] < f[0] + b[0]


def test_an_mla_block_is_priced_with_mla_s_own_bytes_per_element():
    from piper_plan.cost.kernels import stream_time

    m = load_model("deepseek-v2")  # MLA with a query latent
    lay = from_layouts([Layout(gpus=8, dp=8, mbs=1, global_batch=8, seq=4096, fused_kernels=False)])
    t = float(lay.tokens[0])
    want = [stream_time(H200, _token_bytes(m, t, "bf16", ph), eager.OPS["bf16"]["mla_q"][i])
            for i, ph in enumerate("fb")]
    got = eager.token_phase(m, H200, lay)
    assert [g[0] for g in got] == pytest.approx([float(w) for w in want], rel=1e-9)
    # the dense attention's table, at hidden/heads, priced DeepSeek-V2's forward 1.44x short
    dense = m.model_copy(update={"mla": None})
    assert got[0][0] > 1.4 * stream_time(H200, _token_bytes(dense, t, "bf16", "f"), eager.OPS["bf16"]["token"][0])
