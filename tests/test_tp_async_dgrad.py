"""Megatron's asynchronous input-gradient all-reduce (Layout.tp_async_dgrad): without sequence
parallelism each column-parallel layer's backward all-reduce runs beside its weight-gradient
GEMM, checked against one layer of Korthikanti et al. 2022's 22B GPT (their Table 4)."""
import json

import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import column_wgrad
from piper_plan.cost.layer import _dense_block
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model
from piper_plan.validate_kernels import layer_time_check

A100, GPT22 = load_hardware("dgx-a100-80gb"), load_model("gpt-22b")


def _layer(**kw) -> Layout:
    return Layout(gpus=8, tp=8, dp=1, mbs=4, global_batch=4, seq=2048, attention_kernel="eager", dropout=True, **kw)


def _backward_comm(lay: Layout) -> float:
    return float(_dense_block(GPT22, A100, from_layouts([lay]), "bf16")["dense_comm"].b[0])


def test_each_backward_all_reduce_exposes_only_what_its_layer_s_weight_gradient_leaves():
    lay = _layer(sequence_parallel=False)
    b = from_layouts([lay])
    blk = _dense_block(GPT22, A100, b, "bf16")
    ar = float(blk["tp_ar"][0])
    w_attn, w_ffn = (float(x[0]) for x in column_wgrad(GPT22, A100, b, "bf16"))
    want = max(ar - w_attn, 0.0) + max(ar - w_ffn, 0.0)
    assert _backward_comm(lay) == pytest.approx(want, rel=1e-12)
    assert _backward_comm(lay) < 0.25 * 2 * ar  # on 8 NVLink GPUs the GEMMs hide nearly all of it
    assert float(blk["dense_comm"].f[0]) == pytest.approx(2 * ar, rel=1e-12)  # the forward's stay exposed


@pytest.mark.parametrize("other", [dict(tp_async_dgrad=False), dict(fused_kernels=False)])
def test_nothing_hides_without_it_or_in_piper_train(other):
    lay = _layer(sequence_parallel=False, **other)
    tp_ar = float(_dense_block(GPT22, A100, from_layouts([lay]), "bf16")["tp_ar"][0])
    assert _backward_comm(lay) == pytest.approx(2 * tp_ar, rel=1e-12)


def test_sequence_parallelism_and_userbuffers_keep_their_own_rules():
    # with sequence parallelism the backward's all-gathers and reduce-scatters stay exposed (Table 4
    # measures them so); under tp_comm_overlap userbuffers' rule alone applies
    sp = _layer(sequence_parallel=True)
    tp_ar = float(_dense_block(GPT22, A100, from_layouts([sp]), "bf16")["tp_ar"][0])
    assert _backward_comm(sp) == pytest.approx(2 * tp_ar, rel=1e-12)
    assert _backward_comm(sp) == _backward_comm(_layer(sequence_parallel=True, tp_async_dgrad=False))
    ub = dict(sequence_parallel=False, tp_comm_overlap=True)
    assert _backward_comm(_layer(**ub)) == _backward_comm(_layer(**ub, tp_async_dgrad=False))


def test_the_layer_model_meets_korthikanti_s_table_4_within_two_percent():
    rows = layer_time_check()
    assert len(rows) == 5
    for r in rows:
        err = (r["predicted_fwd_ms"] + r["predicted_bwd_ms"]) / (r["measured_fwd_ms"] + r["measured_bwd_ms"]) - 1
        assert abs(err) < 0.02, (r["experiment"], err)
    # full recompute's overhead over none, 39 % measured (the paper: more than 33 % because the
    # backward's all-reduce hides behind the weight gradient only when nothing is recomputed first)
    total = {r["experiment"]: r["predicted_fwd_ms"] + r["predicted_bwd_ms"] for r in rows}
    assert total["Baseline with recompute"] / total["Baseline no recompute"] - 1 == pytest.approx(0.39, abs=0.03)


def test_without_it_the_non_sequence_parallel_backward_is_priced_well_over_the_measured_one():
    lay = _layer(sequence_parallel=False, tp_async_dgrad=False)
    ph = _dense_block(GPT22, A100, from_layouts([lay]), "bf16")
    bwd = float((ph["dense"] + ph["dense_comm"]).b[0] + (ph["dense"] + ph["dense_comm"]).w[0]) * 1e3
    assert bwd > 11.9 * 1.1  # Table 4: 11.9 ms; 13.6 priced with both all-reduces exposed


def test_the_runs_that_waited_are_priced_waiting():
    from piper_plan.validate import _xmoe_settings, data_path, read_rows, row_layout

    rows = {r["id"]: r for r in read_rows(data_path())}
    assert not row_layout(rows["nar21-t1-76.1b"]).tp_async_dgrad  # Megatron-LM of 2021
    assert _xmoe_settings(rows["xmoe-f13-super"])["tp_async_dgrad"] is False  # Megatron-DeepSpeed under DeepSpeed
    assert row_layout(rows["kor22-t5-175b-full"]).tp_async_dgrad


def test_estimate_takes_it_and_plan_json_keeps_it(tmp_path):
    p = tmp_path / "plan.json"
    args = ["estimate", "-m", "gpt-22b", "-H", "dgx-a100-80gb", "-n", "8", "--tp", "8", "--mbs", "4",
            "--global-batch", "4", "--seq", "2048", "--no-sequence-parallel", "--json"]
    on, off = (CliRunner().invoke(main, args + extra) for extra in ([], ["--no-tp-async-dgrad"]))
    assert on.exit_code == 0 and off.exit_code == 0, (on.output, off.output)
    assert json.loads(off.output)["step_time_s"] > json.loads(on.output)["step_time_s"]
    res = CliRunner().invoke(main, args[:-1] + ["--no-tp-async-dgrad", "-o", str(p)])
    assert res.exit_code == 0, res.output
    assert json.loads(p.read_text())["layout"]["tp_async_dgrad"] is False
