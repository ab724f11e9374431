"""The memory model against the paper's equations and Korthikanti 2022 Fig. 1."""
import pytest

from piper_plan.cost import activations as act
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.memory import in_flight, state_bytes
from piper_plan.layout import Layout
from piper_plan.specs.model import ModelSpec


def paper_model(E=8, d=1024, f=2048, H=16, L=8, k=2):
    # the paper's assumptions: square MHA attention (4d² params), SwiGLU experts, no embedding to speak of
    return ModelSpec(name="paper", num_layers=L, hidden_size=d, num_heads=H, vocab_size=1, seq_len=2048,
                     moe={"num_experts": E, "top_k": k, "expert_ffn_size": f, "gated": True})


@pytest.mark.parametrize("pp,ep,mbs", [(4, 1, 2), (4, 4, 1), (2, 8, 4)])
def test_paper_m1f1b_is_a_special_case(pp, ep, mbs):
    """M(i) = (L/PP)·(64d² + 48E·d·f/EP + (PP−i)·(12(b/M)sd + 4(b/M)Hs² + 2(b/M)sk(3f+d)/EP))
    with b/M the micro-batch of one expert-data-parallel rank (the brief's correction: attention
    activations per rank use the local batch), 16 B/param (bf16 grads) and naive attention."""
    m = paper_model()
    d, f, E, H, L, k, s = m.hidden_size, m.moe.expert_ffn_size, m.moe.num_experts, m.num_heads, m.num_layers, 2, 2048
    lay = Layout(gpus=pp * ep, pp=pp, dp=ep, ep=ep, mbs=mbs, global_batch=mbs * ep * 8, seq=s, schedule="1f1b",
                 grad_dtype="bf16", zero=0, sequence_parallel=False)
    b = from_layouts([lay])
    states_attn = sum(state_bytes(m.attn_params, 1, b).values())[0]
    states_exp = sum(state_bytes(E // ep * m.expert_params, 1, b).values())[0]
    assert states_attn == 64 * d * d and states_exp == 48 * E * d * f / ep
    terms = {**act.attention_terms(m, b, naive=True), **act.moe_terms(m, b, imb=1.0)}
    paper_act = sum(float(terms[t][0]) for t in act.PAPER_TERMS)
    bM = mbs  # sequences per micro-batch on this rank
    assert paper_act == 12 * bM * s * d + 4 * bM * H * s * s + 2 * bM * s * k * (3 * f + d)
    for i in range(pp):
        ours = (L / pp) * (states_attn + states_exp + in_flight(b, i)[0] * paper_act)
        eq = (L / pp) * (64 * d * d + 48 * E * d * f / ep
                         + (pp - i) * (12 * bM * s * d + 4 * bM * H * s * s + 2 * bM * s * k * (3 * f + d)))
        assert ours == pytest.approx(eq, rel=1e-12)
    # what the paper's equation leaves out, reported rather than hidden: MoE-block norm, router
    # input and probabilities, expert outputs for the combine
    extra = sum(float(v[0]) for t, v in terms.items() if t not in act.PAPER_TERMS)
    assert extra > 0


# Table IV (brief §4): worst-case re-placement of one layer's experts per GPU (48·E·d·f/8 bytes)
# printed in mixed GB / GiB; latency at 50 GB/s of the printed figure.
TABLE_IV = [("switch-base", 128, 768, 2048, 1.21, 24.2), ("mixtral-8x7b", 8, 4096, 14336, 2.63, 52.6),
            ("mixtral-8x22b", 8, 6144, 16384, 4.50, 90.0), ("grok-1", 8, 6144, 32768, 9.00, 180.0),
            ("glam", 64, 8192, 32768, 102.88, 2057.6), ("deepseek-v2", 160, 5120, 1536, 7.04, 140.8),
            ("deepseek-v3", 256, 7168, 2048, 21.00, 420.0)]


@pytest.mark.parametrize("name,E,d,f,printed,ms", TABLE_IV)
def test_table_iv_expert_state_per_gpu(name, E, d, f, printed, ms):
    m = ModelSpec(name=name, num_layers=1, hidden_size=d, num_heads=8, vocab_size=1,
                  moe={"num_experts": E, "top_k": 1, "expert_ffn_size": f, "gated": True})
    lay = from_layouts([Layout(gpus=1, global_batch=1, seq=1, grad_dtype="bf16", zero=0)])
    per_gpu = sum(state_bytes(E * m.expert_params / 8, 1, lay).values())[0]
    assert min(abs(per_gpu / 1e9 / printed - 1), abs(per_gpu / 2**30 / printed - 1)) < 0.01
    assert printed * 1e9 / 50e9 * 1e3 == pytest.approx(ms, rel=1e-3)


def test_1f1b_stage_i_holds_pp_minus_i_microbatches():
    b = from_layouts([Layout(gpus=8, pp=8, global_batch=64, seq=8)])
    assert [in_flight(b, i)[0] for i in range(8)] == [8, 7, 6, 5, 4, 3, 2, 1]


def test_piper_train_zero2_holds_at_most_a_bucket_cap_per_owner_of_full_gradients():
    """A big model's chunk has far more gradient than its owners' buckets hold: piper-train's
    ZeRO-2 keeps dp x 25 MiB of it (plus one bucket's flat copy), and only piper-train (eager)
    layouts under ZeRO-2 are charged."""
    from piper_plan.cost.rank_memory import BUCKET_CAP_BYTES
    from piper_plan.evaluate import estimate_layout
    from piper_plan.specs.registry import load_hardware, load_model

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    base = dict(gpus=8, dp=8, ep=8, global_batch=64, seq=4096, fused_kernels=False)
    got = {z: estimate_layout(m, hw, Layout(zero=z, **base)).memory["first"]["grad_buckets"][0] for z in (1, 2)}
    fused = estimate_layout(m, hw, Layout(zero=2, **{**base, "fused_kernels": True}))
    cap = BUCKET_CAP_BYTES / 2**30
    # replicated (dp 8) and expert (edp 1: no replicas, reduced at the step) groups
    assert got[2] == pytest.approx(8 * cap + cap)
    assert got[1] == 0.0 and fused.memory["first"]["grad_buckets"][0] == 0.0


def test_without_sequence_parallelism_the_moe_blocks_norm_and_dropout_hold_every_token():
    # X-MoE at TP 2 without sequence parallelism: the sequence splits inside the MoE block only, so
    # the pre-MLP norm's input and the dropout mask after the block hold all t tokens, as the
    # attention block's do; with sequence parallelism both hold t / tp
    from piper_plan.specs.registry import load_model
    m = load_model("xmoe-large")
    base = dict(gpus=4, tp=2, dp=2, ep=2, mbs=1, global_batch=2, seq=4096, dtype="fp16", dropout=True)
    for sp in (False, True):
        b = from_layouts([Layout(**base, sequence_parallel=sp)])
        a, e = act.attention_terms(m, b), act.moe_terms(m, b, imb=1.0)
        assert e["moe_norm_in"][0] == a["attn_norm_in"][0]
        assert e["moe_dropout_mask"][0] == a["attn_dropout_mask"][0]
    without = act.moe_terms(m, from_layouts([Layout(**base, sequence_parallel=False)]), 1.0)
    assert e["moe_norm_in"][0] * 2 == without["moe_norm_in"][0]  # e: the last, with sequence parallelism


def test_a_layouts_saved_activations_do_not_depend_on_the_layouts_priced_beside_it():
    # per-layer costs are priced once per key of the columns they read; a selective layout keyed
    # with one that recomputes nothing must still save what its own recompute leaves
    from piper_plan.cost.estimate import evaluate
    from piper_plan.specs.registry import load_hardware, load_model
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    base = dict(gpus=8, dp=8, mbs=1, global_batch=64, seq=4096, recompute_modules=("core_attn", "mlp"))
    sel, none = Layout(**base, recompute="selective"), Layout(**base, recompute="none")
    alone = [float(evaluate(m, hw, from_layouts([x])).peak_memory_gib[0]) for x in (sel, none)]
    for pair in ([none, sel], [sel, none]):
        together = evaluate(m, hw, from_layouts(pair)).peak_memory_gib
        assert sorted(map(float, together)) == pytest.approx(sorted(alone), rel=1e-12)
    assert alone[0] < alone[1]


def test_fp32_attention_dropout_keeps_its_mask_and_an_fp32_output():
    # Korthikanti's 5as²b (2 B softmax output, 1 B mask, 2 B dropout output) in 16-bit; in fp32
    # the dropout's output takes 4 B an element
    m = paper_model()
    kw = dict(gpus=1, dp=1, mbs=1, global_batch=1, seq=1024, dropout=True, attention_kernel="eager")
    b16, b32 = (from_layouts([Layout(**kw, dtype=d)]) for d in ("bf16", "fp32"))
    sq = 1024 * 1024 * m.num_heads
    assert act.attention_terms(m, b16)["probs_dropout"][0] == 3 * sq
    assert act.attention_terms(m, b32)["probs_dropout"][0] == 5 * sq


def test_recomputing_part_of_the_layers_counts_that_part_of_the_forward_in_hardware_flops():
    from piper_plan.evaluate import estimate_layout
    from piper_plan.specs.registry import load_hardware, load_model
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    lay = dict(gpus=16, pp=4, dp=4, mbs=1, global_batch=64, seq=4096)
    ratio = {}
    for rc, n in (("none", 0), ("full", 2), ("full", 0)):
        e = estimate_layout(m, hw, Layout(**lay, recompute=rc, recompute_layers=n))
        ratio[(rc, n)] = float(e.hw_tflops_per_gpu[0] / e.tflops_per_gpu[0])
    # 32 layers over 4 chunks of 8: 2 of each chunk's 8 re-run a quarter of the layers' forward;
    # the LM head (2·V·d a token) does not re-run
    fwd = m.flops_per_token(4096) / 3
    layers = (fwd - 2 * m.vocab_size * m.hidden_size) / fwd
    assert ratio[("none", 0)] == pytest.approx(1.0)
    assert ratio[("full", 2)] == pytest.approx(1 + 0.25 * layers / 3, rel=1e-6)
    assert ratio[("full", 0)] == pytest.approx(1 + layers / 3, rel=1e-6)
    assert ratio[("full", 0)] < 4 / 3 - 0.01  # llama3-8b's head is 6.5 % of its forward


def test_an_eager_attention_kernel_s_hardware_flops_count_the_masked_scores_it_computes():
    """Materialised scores are whole s x s GEMMs, masked after: the hardware count holds them
    (Narayanan 2021 eq. 3, attention whole; full recompute runs that forward again), the model
    count keeps the causal half."""
    from piper_plan.evaluate import estimate_layout
    from piper_plan.specs.registry import load_hardware, load_model
    m, hw = load_model("gpt-1.7b"), load_hardware("dgx-a100-80gb")
    lay = dict(gpus=8, dp=8, mbs=1, global_batch=8, seq=2048)
    for rc, runs in (("none", 3), ("full", 4)):
        e = {k: estimate_layout(m, hw, Layout(**lay, recompute=rc, attention_kernel=k)) for k in ("flash", "eager")}
        step = float(e["eager"].step_time_s[0])
        hw_flops = {k: float(x.hw_tflops_per_gpu[0]) * 1e12 * float(x.step_time_s[0]) * 8 for k, x in e.items()}
        masked = m.num_layers * (m.attn_core_flops(2048, causal=False) - m.attn_core_flops(2048)) * 8 * 2048
        assert hw_flops["eager"] - hw_flops["flash"] == pytest.approx(runs * masked, rel=1e-9)
        assert float(e["eager"].tflops_per_gpu[0]) * 1e12 * step * 8 == pytest.approx(
            m.flops_per_token(2048) * 8 * 2048, rel=1e-9)


def test_gpipe_s_last_stage_keeps_every_micro_batch_s_logits_until_its_backward():
    # all M forwards run before any backward: each micro-batch's fp32 logits (4 B an element)
    # wait for its loss's backward, and one micro-batch's gradient (the activation dtype) joins
    # them; 1F1B's last stage holds one micro-batch's of each
    from piper_plan.cost.estimate import evaluate
    from piper_plan.specs.registry import load_hardware, load_model
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    base = dict(gpus=64, tp=2, pp=4, dp=8, ep=8, mbs=1, global_batch=64, seq=4096, recompute="full")
    gpipe, f1b = (evaluate(m, hw, from_layouts([Layout(**base, schedule=s)])) for s in ("gpipe", "1f1b"))
    M = 64 // 8
    one = f1b.memory["last"]["logits"][0]
    assert one == pytest.approx(4096 * m.vocab_size / 2 * (4 + 2) / 2**30)
    assert gpipe.memory["last"]["logits"][0] == pytest.approx(one * (4 * M + 2) / (4 + 2))


@pytest.mark.parametrize("pp,vpp,more", [(4, 2, 0.5), (8, 4, 0.25), (1, 1, 0.0)])
def test_the_ep_overlap_holds_one_more_warm_up_micro_batch_over_a_pipeline(pp, vpp, more):
    # Megatron-Core's --overlap-moe-expert-parallel-comm runs one more warm-up forward in the
    # interleaved schedule (get_pp_rank_microbatches): a chunk-micro-batch more on every rank;
    # without pipelining it adds no warm-up
    base = dict(gpus=8 * pp, pp=pp, vpp=vpp, dp=8, ep=8, mbs=1, global_batch=256, seq=4096,
                schedule="interleaved" if pp > 1 else "1f1b")
    b = from_layouts([Layout(**base, a2a_overlap=x) for x in (False, True)])
    for i in range(pp):
        without, with_ = in_flight(b, i)
        assert with_ - without == pytest.approx(more)


def test_full_recompute_rebuilds_one_layer_beside_the_inputs_it_keeps():
    # the activations stay the layer inputs Korthikanti 2022 counts; the layer the backward re-runs
    # holds what it saves without recompute, less its input, for as long as its backward takes
    from piper_plan.cost.estimate import Routing, _pipeline, evaluate
    from piper_plan.specs.registry import load_hardware, load_model
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    base = dict(gpus=64, tp=2, pp=4, dp=8, ep=8, mbs=1, global_batch=64, seq=4096)
    full, none = (from_layouts([Layout(**base, recompute=r)]) for r in ("full", "none"))
    est, lc_full, lc_none = evaluate(m, hw, full), _pipeline(m, hw, full, Routing(), "bf16").lc, \
        _pipeline(m, hw, none, Routing(), "bf16").lc
    first = est.memory["first"]
    a_in = act.layer_input_bytes(m, full)[0]
    assert first["activations"][0] == pytest.approx(4 * 8 * a_in / 2**30)  # 4 in flight x 8 layers, inputs only
    assert first["recomputed_layer"][0] == pytest.approx((lc_none["a_moe"][0] - a_in) / 2**30)
    assert lc_full["a_moe"][0] == a_in
    assert evaluate(m, hw, none).memory["first"]["recomputed_layer"][0] == 0.0
    assert est.row(0)["memory_gib_per_stage"][0]["recomputed_layer"] > 0
    assert "recomputed_layer" not in evaluate(m, hw, none).row(0)["memory_gib_per_stage"][0]


def test_a_moe_rank_holds_its_all_to_alls_send_and_receive_buffers():
    # Mixtral 8x7B, tp 2 with SP, 4,096 tokens a micro-batch: each rank routes 2,048 tokens x top-2
    # rows of 4,096 bf16 values, once to send and once to receive, at the busiest rank's imbalance
    from piper_plan.evaluate import estimate_layout
    from piper_plan.specs.registry import load_hardware, load_model

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    est = estimate_layout(m, hw, Layout(gpus=16, tp=2, pp=2, dp=4, ep=8, global_batch=64, seq=4096))
    rows = 4096 / 2 * 2
    want = 2 * rows * 4096 * 2 * float(est.imbalance[0]) / 2**30
    assert est.memory["first"]["a2a_buffers"][0] == pytest.approx(want)
