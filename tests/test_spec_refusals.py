"""A user's spec that cannot describe a real machine or model is refused in one line naming the
file and field, never priced: a value the planner would never read, a mesh spanning nodes, a spec
passed as the other kind. A device its reserve fills is said to fit nothing on any number of GPUs.
And NICs shared unevenly are priced at the busiest NIC's share."""
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.errors import SpecError
from piper_plan.specs import load_hardware, load_model


def spec(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,says", [
    ("base: dgx-h200\naccelerator: {peak_tflops: {BF16: 500}}\n", "peak_tflops keys must be among"),
    ("base: dgx-h200\naccelerator: {peak_tflops: {bfloat16: 500}}\n", "not ['bfloat16']"),
    ("base: dgx-h200\nnetwork: {rail_optimized: false, cross_rail_taper: 0.5}\n", "topology[*].taper"),
    ("base: dgx-h200\nmax_gpus: 4096\ntopology:\n  - {name: node, size: 8, bandwidth_gbps: 450, latency_us: 3}\n"
     "  - {name: torus, size: 4096, bandwidth_gbps: 600, latency_us: 5, mesh: true}\n", "a torus or other direct"),
])
def test_a_hardware_spec_that_cannot_be_a_machine_is_refused(tmp_path, text, says):
    with pytest.raises(SpecError) as e:
        load_hardware(spec(tmp_path, text))
    msg = str(e.value)
    assert says in msg and "\n" not in msg and msg.startswith(str(tmp_path))


MOE = ("name: m\nnum_layers: 4\nhidden_size: 512\nnum_heads: 8\nvocab_size: 1000\nffn_size: 1024\n"
       "moe: {num_experts: 8, top_k: 2, expert_ffn_size: 256")


@pytest.mark.parametrize("text,says", [
    (MOE + ", shared_expert_ffn_size: 512}\n", "shared_expert_ffn_size needs shared_experts > 0"),
    ("name: d\nnum_layers: 4\nhidden_size: 512\nnum_heads: 8\nvocab_size: 1000\nffn_size: 1024\ndense_layers: 2\n",
     "a dense model has no moe"),
    ("base: deepseek-v3\nhead_dim: 64\n", "head_dim is unused with mla"),
])
def test_a_model_field_the_planner_would_never_read_is_refused(tmp_path, text, says):
    with pytest.raises(SpecError, match=None) as e:
        load_model(spec(tmp_path, text))
    assert says in str(e.value)


def test_a_spec_passed_as_the_other_kind_says_which_it_is(tmp_path):
    hw = spec(tmp_path, "base: dgx-h200\nnetwork: {nics_per_node: 4}\n", "hw.yaml")
    model = spec(tmp_path, MOE + "}\n", "m.yaml")
    r = CliRunner().invoke(main, ["estimate", "-m", hw, "-H", model, "-n", "8"])
    assert r.exit_code == 2 and r.output.strip().endswith("pass it as the hardware (-H)")
    r = CliRunner().invoke(main, ["estimate", "-m", model, "-H", model, "-n", "8"])
    assert r.exit_code == 2 and r.output.strip().endswith("pass it as the model (-m)")


def test_nics_shared_unevenly_are_priced_at_the_busiest_nic_s_share(tmp_path):
    h200 = load_hardware("dgx-h200")  # 8 NICs of 50 GB/s, one a GPU
    assert h200.nic_gbps_per_gpu == 50.0
    # four NICs of eight unused: two GPUs on each of the others
    aff = load_hardware(spec(tmp_path, "base: dgx-h200\nnetwork: {nic_affinity: [0, 0, 1, 1, 2, 2, 3, 3]}\n"))
    assert aff.nic_gbps_per_gpu == 25.0
    # three NICs for eight GPUs: the third carries four (GPUs 4-7), at 12.5 GB/s each, not the even 18.75
    three = load_hardware(spec(tmp_path, "base: dgx-h200\nnetwork: {nics_per_node: 3}\n", "t.yaml"))
    assert [three.nic_of(g) for g in range(8)] == [0, 0, 1, 1, 2, 2, 2, 2]
    assert three.nic_gbps_per_gpu == 12.5


def test_a_device_its_reserve_fills_fits_nothing_and_no_more_gpus_are_advised(tmp_path):
    hw = spec(tmp_path, "base: dgx-h200\naccelerator: {memory_gib: 1}\n")
    r = CliRunner().invoke(main, ["search", "-m", "mixtral-8x7b", "-H", hw, "-n", "16", "--global-batch", "64"])
    assert r.exit_code == 1 and "nothing fits on any number of GPUs: the spec's reserve" in r.output
    assert "more GPUs" not in r.output
