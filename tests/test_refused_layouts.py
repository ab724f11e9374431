"""Layouts and options no runtime runs, or that would do nothing for the layout given, are refused
in one line by estimate and left out (and counted) by search: each rule read off the runtime that
would run it (Megatron-Core's TransformerConfig and arguments, Transformer Engine's checks)."""
from __future__ import annotations

import pytest
from bad_input_support import _run, one_line


MIXTRAL_GB200 = ["estimate", "-m", "mixtral-8x7b", "-H", "gb200-nvl72", "-n", "64", "--tp", "2", "--ep", "8",
                 "--global-batch", "256"]


@pytest.mark.parametrize("extra,needle", [
    # Megatron-Core's TransformerConfig refuses its layer-level CPU offloading beside each of these
    (["--pp", "4", "--offload-layers", "4"], "offload_layers with pp 1"),
    (["--recompute", "full", "--offload-layers", "4"], "offload_layers without recompute"),
    (["--cuda-graphs", "attn", "--offload-layers", "4"], "offload_layers without cuda_graphs"),
    (["--offload-modules", "expert_fc1", "--offload-layers", "4"], "offload_layers or offload_modules, not both"),
    # a whole MoE layer is graphed only where token dropping fixes its shapes
    (["--cuda-graphs", "moe"], "cuda_graphs without moe"),
    # FP8 attention is part of an FP8 recipe, as FP8 weights are
    (["--attention-fp8"], "attention_fp8 with an fp8 recipe"),
    (["--recompute", "selective", "--recompute-modules", "mlp"], "mlp names a part mixtral-8x7b does not have"),
])
def test_a_combination_the_runtime_refuses_is_refused_not_priced(extra, needle):
    one_line([*MIXTRAL_GB200, *extra], needle)


@pytest.mark.parametrize("cmd", ["estimate", "search"])
def test_mxfp8_on_a_gpu_before_blackwell_is_one_line(cmd):
    args = ["-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--global-batch", "256", "--fp8", "mxfp8"]
    one_line([cmd, *args, *(["--tp", "2", "--ep", "8"] if cmd == "estimate" else [])],
             "fp8 mxfp8 needs compute capability 10 or later", "compute capability 9")


@pytest.mark.parametrize("cmd", ["estimate", "search"])
def test_mxfp8_on_an_amd_gpu_before_gfx950_is_one_line_and_runs_on_mi355x(cmd):
    args = ["-m", "mixtral-8x7b", "-n", "64", "--global-batch", "256", "--fp8", "mxfp8",
            *(["--tp", "1", "--ep", "8"] if cmd == "estimate" else [])]
    one_line([cmd, "-H", "amd-mi300x", *args], "fp8 mxfp8 needs gfx950 or later", "is gfx942")
    code, out, _ = _run([cmd, "-H", "amd-mi355x", *args])
    assert code == 0 and ("fp8=mxfp8" if cmd == "estimate" else "fp8 mxfp8 GEMMs") in out, out


def test_search_refuses_a_selective_set_naming_a_part_the_model_lacks_as_estimate_does():
    # search had ranked rc=selective(shared_experts) on Mixtral, a plan estimate then refused
    one_line(["search", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--selective", "shared_experts"],
             "shared_experts names a part mixtral-8x7b does not have")


def test_search_leaves_out_layer_offloading_megatron_core_refuses_and_counts_it():
    code, out, _ = _run(["search", "-m", "mixtral-8x7b", "-H", "gb200-nvl72", "-n", "64", "--global-batch", "256",
                         "--offload-layers", "0,4", "--top", "50"])
    assert code == 0, out
    assert "offload_layers with pp 1, no recompute, cuda_graphs or offload_modules" in out
    offloaded = [ln for ln in out.splitlines() if "offload(4 layers)" in ln]
    assert offloaded  # ranked, and each runs one stage without recompute
    assert all(" pp1 " in ln and "rc=none" in ln for ln in offloaded), offloaded


@pytest.mark.parametrize("extra,needle", [
    (["--ep", "1", "--a2a", "halo"], "--a2a halo: no expert exchange at ep 1"),
    (["--ep", "1", "--placement", "spread"], "--placement spread: no expert group to place at ep 1"),
    (["--ep", "8", "--tp-comm-overlap"], "--tp-comm-overlap: no tensor-parallel collective at tp 1"),
    (["--ep", "8", "--a2a-sms", "64"], "--a2a-sms 64: no all-to-all hides behind compute"),
    # HALO aggregates only a group with several members on each of several nodes: an EP group of 8
    # inside one DGX node, or spread one a node, had been written "halo" and run (and priced) flat
    (["--ep", "8", "--a2a", "halo"], "--a2a halo: no EP group has several members on each of several nodes of 8"),
    (["--ep", "8", "--a2a", "halo", "--placement", "spread"], "--a2a halo: no EP group has several members"),
    # ZeRO shards over the data-parallel ranks: with none (dp 1, expert dp 1) a stage given does nothing
    (["--pp", "8", "--tp", "8", "--dp", "1", "--ep", "8", "--etp", "8", "--zero", "2"],
     "--zero 2: no data-parallel rank to shard over"),
])
def test_an_estimate_option_that_does_nothing_for_its_layout_is_refused(extra, needle):
    one_line(["estimate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--global-batch", "256", *extra],
             needle, "so it does nothing; leave it out")


def test_halo_is_kept_where_it_aggregates_and_zero_where_experts_shard_over_tp():
    from piper_plan.cli_checks import halo_aggregates
    from piper_plan.layout import Layout

    two_nodes = Layout(gpus=16, dp=16, ep=16, global_batch=64, seq=4096, a2a="halo")
    assert halo_aggregates(two_nodes, 8) and not halo_aggregates(two_nodes, 16)
    code, out, _ = _run(["estimate", "-m", "tiny-moe", "-H", "emu-rail-1", "-n", "4", "--ep", "4", "--dp", "4",
                         "--a2a", "halo", "--global-batch", "8"])
    assert code == 0 and "a2a=halo" in out, out
    # tp 2 at dp 1 and ep 1: each expert is held by both tp ranks (expert dp 2), which ZeRO shards
    code, out, _ = _run(["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "2", "--tp", "2", "--zero", "1",
                         "--global-batch", "8"])
    assert code == 0, out
