"""benchmarks/eager_bytes.py: piper-train's eager block, op by op, against the planner's fused
elementwise passes."""
import pytest
from benchmark_support import load_benchmark

pytest.importorskip("torch")


def _bench():
    return load_benchmark("eager_bytes")


def test_eager_modules_move_more_than_the_fused_passes_and_in_proportion_to_the_tokens():
    b = _bench()
    short, long = b.count_block("tiny-dense", 64), b.count_block("tiny-dense", 128)
    fused = b.priced_fused(short["spec"], 64)
    assert short["bytes"]["elementwise"] > 2 * fused
    # the same ops on twice the tokens move twice the bytes; the weight casts do not grow
    assert long["ops"] == short["ops"]
    assert long["bytes"]["elementwise"] == pytest.approx(2 * short["bytes"]["elementwise"], rel=0.02)
    assert long["bytes"]["weight_casts"] == short["bytes"]["weight_casts"]


def test_a_moe_block_s_grouped_gemms_are_not_counted_as_elementwise_and_its_routed_rows_are():
    b = _bench()
    one, two = b.count_block("tiny-moe", 64, moe=True), b.count_block("tiny-moe", 64, moe=True, mbs=2)
    assert one["ops"]["gemm_attention"] >= 3  # the experts' grouped GEMMs among them, forward and backward
    # twice the micro-batch: about twice the traffic (the CPU path pads each expert's rows to a
    # multiple, so small blocks grow a little faster than their tokens)
    assert 1.8 < two["bytes"]["elementwise"] / one["bytes"]["elementwise"] < 2.5


def test_the_ratio_readme_quotes_is_the_one_the_benchmark_counts():
    """README's Benchmarks table quotes 3.74x on Llama 3 8B's block at 512 tokens: the counted bytes
    (torch's dispatch, deterministic), not a timing, so the figure is held here as it is printed."""
    from pathlib import Path

    b = _bench()
    r = b.count_block("llama3-8b", 512)
    ratio = r["bytes"]["elementwise"] / b.priced_fused(r["spec"], 512)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert f"{ratio:.2f}× on Llama 3 8B's block at 512 tokens" in readme, f"{ratio:.2f}"
