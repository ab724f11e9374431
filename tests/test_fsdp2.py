"""ZeRO-3 as torch FSDP2 runs it (Layout.fsdp2): each gather's parameters are copied out of
the all-gather's flat buffer, each reduction's gradients copied into the reduce-scatter's in the
reduce dtype, on the compute stream, so nothing hides them; Megatron-FSDP's in-place buffers pay
neither. PyTorch-native validation rows on ZeRO-3 run it unless a row says otherwise."""
import json

import pytest
from click.testing import CliRunner
from table_support import bundled_rows, write_rows

from piper_plan import validate as V
from piper_plan.cli import main
from piper_plan.cost.kernels import stream_time
from piper_plan.errors import LayoutError
from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout, check_for
from piper_plan.search import SearchSpace, search
from piper_plan.specs import load_hardware, load_model

A100 = load_hardware("dgx-a100-80gb")
M8B = load_model("llama3-8b")
BASE = dict(gpus=64, dp=64, zero=3, mbs=1, seq=8192, attention_kernel="fa2")


def _dp(**kw):
    est = estimate_layout(M8B, A100, Layout(**{**BASE, "global_batch": 128, **kw}))
    return est.time["dp_comm"][0], est.step_time_s[0]


def test_each_micro_batch_pays_the_copies_of_its_gathers_and_its_reduction_in_full():
    # 128 sequences on 64 ranks: two micro-batches, each gathering twice (forward, backward) and reducing once,
    # its gathers and reductions otherwise hidden behind the compute
    plain, with_copies = _dp(), _dp(fsdp2=True)
    assert plain == (0.0, pytest.approx(plain[1]))
    p = M8B.total_params
    units = M8B.num_layers + 1  # a unit a block and one for the tables (estimate's ZeRO-3 unit count)
    # copy-out reads and writes each bf16 parameter (2 + 2 B); copy-in reads the bf16 gradient, writes it fp32
    per_mb = 2 * stream_time(A100, 4.0 * p, units) + stream_time(A100, 6.0 * p, units)
    assert with_copies[0] == pytest.approx(2 * float(per_mb), rel=0.02)
    assert with_copies[1] - plain[1] == pytest.approx(with_copies[0], rel=1e-6)  # on the step's path
    kept, _ = _dp(fsdp2=True, reshard_after_forward=False)  # one gather a micro-batch
    assert kept == pytest.approx(with_copies[0] - 2 * float(stream_time(A100, 4.0 * p, units)), rel=0.02)


def test_only_zero_3_has_them_and_the_search_prices_them_on_its_zero_3_layouts_alone():
    with pytest.raises(LayoutError, match="fsdp2 with zero 3"):
        check_for(Layout(**{**BASE, "zero": 1, "global_batch": 64, "fsdp2": True}), M8B, A100)
    with pytest.raises(LayoutError, match="fsdp2 with zero 3"):  # a space with no ZeRO-3 layout to price it on
        SearchSpace(gpus=16, global_batch=32, seq=4096, zeros=(1,), fsdp2=True)
    kw = dict(gpus=16, global_batch=32, seq=4096, schedules=("1f1b",))
    plain = search(M8B, A100, SearchSpace(**kw))
    fsdp2 = search(M8B, A100, SearchSpace(**kw, fsdp2=True))
    assert (fsdp2.batch.fsdp2 == (fsdp2.batch.zero == 3)).all()
    z3 = plain.batch.zero == 3
    assert z3.any() and (fsdp2.est.step_time_s[z3] > plain.est.step_time_s[z3]).all()
    # the other stages price as the same torch stack's without them: autograd's adds into the held
    # gradients (Layout.wgrad_accum add, an FSDP2 space's own), nothing of FSDP2's
    torch_adds = search(M8B, A100, SearchSpace(**kw, wgrad_accum="add"))
    assert (fsdp2.est.step_time_s[~z3] == torch_adds.est.step_time_s[~z3]).all()


def test_the_cli_takes_them_for_one_layout():
    args = ["estimate", "-m", "llama3-8b", "-H", "dgx-a100-80gb", "-n", "8", "--zero", "3", "--seq", "4096",
            "--global-batch", "8", "--json"]
    runs = [CliRunner().invoke(main, args + flag) for flag in ([], ["--fsdp2"])]
    assert all(r.exit_code == 0 for r in runs), runs[1].output
    plain, copies = (json.loads(r.output) for r in runs)
    assert copies["layout"]["fsdp2"] and copies["step_time_s"] > plain["step_time_s"]
    bad = CliRunner().invoke(main, args[:-1] + ["--zero", "1", "--fsdp2"])
    assert bad.exit_code != 0 and "fsdp2 with zero 3" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_pytorch_native_rows_on_zero_3_run_fsdp2_unless_the_row_says_no(tmp_path):
    rows = bundled_rows("torchtitan")
    said_no = write_rows(tmp_path / "no.csv", [dict(r, fsdp2="no") for r in rows],
                         list(rows[0]) + ["fsdp2"])
    path = V.data_path().parent / "torchtitan.csv"
    got = {r.id: r.predicted for r in V.run(path=path)}
    without = {r.id: r.predicted for r in V.run(path=said_no)}
    zero3 = {r["id"] for r in rows if r["zero_stage"] == "3"}
    assert zero3 and all(got[k] < without[k] for k in zero3)
    assert all(got[k] == without[k] for k in got if k not in zero3)  # FSDP under pipelining: ZeRO-1's traffic
    # a Megatron row stays in place unless it says yes
    mb = [r for r in bundled_rows("published") if r.get("zero_stage") == "3"][:1]
    assert mb
    yes = write_rows(tmp_path / "yes.csv", [dict(mb[0], fsdp2="yes")], list(mb[0]) + ["fsdp2"])
    plain = write_rows(tmp_path / "plain.csv", mb)
    assert V.run(path=yes)[0].predicted < V.run(path=plain)[0].predicted


def test_its_fp32_shard_is_the_optimizers_parameter_with_no_bf16_shard_beside_it():
    lay = Layout(**{**BASE, "global_batch": 64})
    plain, fsdp2 = (estimate_layout(M8B, A100, lay.model_copy(update={"fsdp2": f})).memory["first"] for f in (0, 1))
    assert plain["weights"][0] > 0 and fsdp2["weights"][0] == 0.0  # Megatron-FSDP keeps a bf16 shard
    assert fsdp2["master"][0] == plain["master"][0] and fsdp2["grads"][0] == plain["grads"][0]
    assert fsdp2["total"][0] == pytest.approx(plain["total"][0] - plain["weights"][0])
