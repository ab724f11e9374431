"""How `validate --table` reads a third-party table: a name that is not a bundled model is priced
only as the model it names (never another size or kind, nor another family's conventions), a
number is read as its writer meant it or refused, and every cell lands somewhere or is named."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.validate_rows import (TableError, bundled_as, built_on, missing_model, read_rows, row_hardware,
                                      row_model)

HF = Path(__file__).parent / "data" / "hf"
HEAD = "id,group,model,hardware,gpus,seq,metric,value,tp,pp,ep,dp,mbs,gbs"
ARCH = ("layers", "hidden", "heads", "ffn", "vocab", "experts", "topk", "expert_ffn", "kv_heads", "model_spec")


def row(model, **cols):
    r = dict.fromkeys(ARCH, "")
    r.update(cols, model=model, id="r")
    return r


def table(tmp_path, lines, name="t.csv", head=HEAD):
    p = tmp_path / name
    p.write_text("\n".join([head, *lines]) + "\n")
    return p


def validate(*args):
    r = CliRunner().invoke(main, ["validate", *args])
    return r.exit_code, r.output


@pytest.mark.parametrize("name", ["Qwen3-32B", "Qwen2.5-72B", "Qwen2-72B", "DeepSeek-R1", "DeepSeek-V2-Lite",
                                  "DeepSeek-V4", "Kimi K3", "Kimi K1.5"])
def test_a_name_alone_that_is_another_model_is_not_priced(name):
    # Qwen3-32B is dense, the bundled Qwen3 of ~32B a MoE; R1 is no V; V2-Lite is 16B; V4 and K3 other majors
    assert missing_model(row(name))


@pytest.mark.parametrize("name,spec", [
    ("DeepSeek-V3-Base", "deepseek-v3"), ("DeepSeek-V3.1", "deepseek-v3"), ("Qwen3 235B", "qwen3-235b-a22b"),
    ("Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"), ("Llama-4-Scout-17B-16E", "llama4-scout"),
    ("LLAMA4-Scout-LLM", "llama4-scout"), ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("Llama-3.1-8B-Instruct", "llama3-8b"), ("GLM-4.6", "glm-4.5"), ("DeepSeek-V3.1-Terminus", "deepseek-v3"),
    ("Kimi-K2-Thinking", "kimi-k2"), ("Kimi K2 1T MoE", "kimi-k2"), ("GLM-4.5-Air 106B MoE", "glm-4.5-air"),
    ("Mixtral 141B", "mixtral-8x22b"), ("Llama-4-Maverick-17B-128E-Thinking", "llama4-maverick"),
])
def test_a_release_s_name_alone_is_priced_as_its_bundled_model(name, spec):
    m = row_model("t.csv", row(name))
    assert (built_on(m) or m.name) == spec


def test_columns_that_name_a_dense_model_build_a_dense_gated_one_of_its_size():
    # Qwen3-32B's FFN is 5 d wide, as GELU's; its 32B in the name says SwiGLU (30.5B on Llama, 24.3B on GPT)
    m = row_model("t.csv", row("Qwen3-32B", layers="64", hidden="5120", heads="64", ffn="25600", vocab="151936"))
    assert m.moe is None and m.ffn_gated and built_on(m).startswith("llama")
    assert 0.9 < m.total_params / 32e9 < 1.0


@pytest.mark.parametrize("name,cols,spec", [
    # an active size (A2.7B), two sizes (1B-7B) or an active size unmarked (Maverick 17B): no size to hold
    ("Qwen1.5-MoE-A2.7B", dict(layers="24", hidden="2048", heads="16", vocab="151936", experts="60", topk="4",
                               expert_ffn="1408"), "qwen2-57b-a14b"),
    ("OLMoE-1B-7B", dict(layers="16", hidden="2048", heads="16", vocab="50304", experts="64", topk="8",
                         expert_ffn="1024"), "qwen3-30b-a3b"),
    ("Llama 4 Maverick 17B", dict(layers="48", hidden="5120", heads="40", vocab="202048", experts="128", topk="1",
                                  expert_ffn="8192"), "llama4-maverick"),
    # a DeepSeek's shared experts and dense first layers are its MoE family's, not its own code
    ("DeepSeek-MoE-16B", dict(layers="28", hidden="2048", heads="16", vocab="102400", experts="64", topk="6",
                              expert_ffn="1408"), "deepseek-v2"),
])
def test_a_moe_name_s_size_is_a_part_s_and_its_family_keeps_its_own(name, cols, spec):
    assert built_on(row_model("t.csv", row(name, **cols))) == spec


def test_one_word_in_common_carries_no_family_s_conventions():
    # Llama 4's shared expert and chunked attention are not Llama-3-MoE's; GPT-OSS's windows not GPT-MoE's
    for name, cols in (("Llama-3-MoE-8x8B", dict(layers="32", hidden="4096", heads="32", vocab="128256", experts="8",
                                                  topk="2", expert_ffn="14336")),
                       ("GPT-MoE-1.3B-64E", dict(layers="24", hidden="2048", heads="16", vocab="50257", experts="64",
                                                 topk="1", expert_ffn="8192"))):
        m = row_model("t.csv", row(name, **cols))
        assert not m.moe.shared_experts and m.sliding_window is None and m.attention_chunk is None, built_on(m)


@pytest.mark.parametrize("name,mtp", [
    ("DeepSeek-V3 no MTP", 0), ("DeepSeek-V3 without MTP", 0), ("DeepSeek-V3 w/o MTP", 0),
    ("DeepSeek-V3, MTP disabled", 0), ("DeepSeek-V3 (MTP off)", 0), ("DeepSeek-V3 MTP=0", 0),
    ("DeepSeek-V3 no-MTP", 0), ("DeepSeek-V3 MTP-off", 0), ("DeepSeek-V3 noMTP", 0),
    ("DeepSeek-V3 with MTP", 1), ("DeepSeek-V3 (with MTP)", 1), ("DeepSeek-V3 + MTP", 1), ("deepseek-v3-mtp", 1),
    ("DeepSeek V3 w/ MTP", 1),
])
def test_what_a_name_says_of_the_mtp_module_is_what_is_priced(name, mtp):
    m = row_model("t.csv", row(name))
    assert m.mtp_layers == mtp and (built_on(m) or m.name).startswith("deepseek-v3")


@pytest.mark.parametrize("name", ["H100 PCIe", "H100 PCIe 80GB", "H100 NVL", "A100 PCIe", "H200 NVL", "H800 PCIe"])
def test_a_pcie_or_nvl_card_is_none_of_the_sxm_systems(name):
    assert bundled_as(name, "hardware") is None


@pytest.mark.parametrize("name,spec", [("H100 SXM", "dgx-h100"), ("GB200 NVL72", "gb200-nvl72"),
                                       ("GB300-NVL72", "gb300-nvl72"), ("GB200 NVL", "gb200-nvl72"),
                                       ("B200 NVL", "dgx-b200")])
def test_sxm_and_rack_names_still_name_their_systems(name, spec):
    assert bundled_as(name, "hardware") == spec


def _cells(value):
    return ["a", "g", "mixtral-8x7b", "dgx-h100", "64", "4096", "tokens_per_s_per_gpu", value, "2", "1", "8", "32",
            "1", "256"]


@pytest.mark.parametrize("sep,value", [("\t", "3,000"), (";", "3.000")])
def test_a_grouped_number_a_locale_cannot_tell_is_refused(tmp_path, sep, value):
    p = table(tmp_path, [sep.join(_cells(value))], head=HEAD.replace(",", sep))
    with pytest.raises(TableError, match=f"value: '{value}' reads as 3000 in one locale"):
        read_rows(p)


@pytest.mark.parametrize("sep,value,reads", [("\t", "1.500", "1.500"), (";", "1,420", "1.420")])
def test_a_decimal_either_locale_writes_so_is_read(tmp_path, sep, value, reads):
    # a tab file's point is a decimal in every locale that groups with a comma (and in Python's output)
    p = table(tmp_path, [sep.join(_cells(value))], head=HEAD.replace(",", sep))
    assert float(read_rows(p)[0]["value"]) == float(reads)


def test_batch_scan_compares_each_row_in_its_own_metric(tmp_path):
    # (a memory row with no layout is not searched: validate refuses it, the scan leaves it out)
    p = table(tmp_path, ["it,g,llama3-8b,dgx-h100,8,4096,iteration_time_s,2.5,,,,,,128",
                         "tk,g,llama3-8b,dgx-h100,8,4096,tokens_per_s_per_gpu,11000,,,,,,128"])
    mem = table(tmp_path, ["mem,g,llama3-8b,dgx-h100,8,4096,activation_gib_per_gpu,20,,,,,,128"], name="m.csv")
    from piper_plan.validate_batch import batch_scan as scan
    assert scan(path=mem) == []
    from piper_plan.validate import run
    from piper_plan.validate_batch import batch_scan

    priced = {r.id: r.predicted for r in run(path=p)}
    scanned = {r["id"]: r["default"]["predicted"] for r in batch_scan(path=p)}
    assert scanned == pytest.approx(priced, rel=1e-9)
    assert 1 < scanned["it"] < 100 and scanned["tk"] > 1000  # seconds and tokens, not TFLOPS


@pytest.mark.parametrize("cells,vpp,says", [
    ("1,8,1,1,1,64", "7", "pp*vpp <= layers + 2: 56 pipeline chunks (pp 8 x vpp 7) for 32 layers"),
    ("1,1,1,8,1,64", "2", "pp=1 runs no pipeline schedule: vpp=2 with one stage"),
])
def test_a_pipeline_no_run_holds_is_refused(tmp_path, cells, vpp, says):
    p = table(tmp_path, [f"a,g,llama3-8b,dgx-h100,8,4096,tokens_per_s_per_gpu,9000,{cells},{vpp}"],
              head=HEAD + ",vpp")
    code, out = validate("--table", str(p))
    assert code != 0 and says in out and "Traceback" not in out


def test_a_blank_id_is_named_by_its_line_in_the_file(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(HEAD + "\n\n\n,g,llama3-8b,dgx-h100,8,4096,tokens_per_s_per_gpu,9000,1,1,,8,1,64\n")
    with pytest.raises(TableError, match="row at line 4: id: blank"):
        read_rows(p)


def test_a_spreadsheet_s_empty_rows_are_skipped_and_a_value_without_heading_refused(tmp_path):
    line = "a,g,llama3-8b,dgx-h100,8,4096,tokens_per_s_per_gpu,9000,1,1,,8,1,64"
    assert [r["id"] for r in read_rows(table(tmp_path, [line, ",,,,,,,,,,,,,", ",,,,,,,,,,,,,"]))] == ["a"]
    with pytest.raises(TableError, match="'IMPORTANT' sits under a column with no heading"):
        read_rows(table(tmp_path, [line + ",IMPORTANT"], head=HEAD + ","))


def test_a_comma_and_space_file_reads_its_quoted_cells(tmp_path):
    p = table(tmp_path, ['a, g, llama3-8b, dgx-h100, 8, 4096, tokens_per_s_per_gpu, "9,000", 1, 1, , 8, 1, 64'])
    assert read_rows(p)[0]["value"] == "9000"


def test_spec_paths_are_read_beside_the_table_and_a_bad_hardware_spec_is_named_so(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "qwen3.json").write_text((HF / "qwen3-8b.json").read_text())
    p = table(sub, ["a,g,Qwen3 8B,dgx-h100,8,4096,tokens_per_s_per_gpu,9000,1,1,,8,1,64,qwen3.json,"],
              head=HEAD + ",model_spec,hardware_spec")
    monkeypatch.chdir(tmp_path)
    (r,) = read_rows(p)
    assert row_model(p, r).num_layers == json.loads((HF / "qwen3-8b.json").read_text())["num_hidden_layers"]
    r["hardware_spec"] = "no-such-machine"
    with pytest.raises(TableError, match="row a: hardware_spec: "):
        row_hardware(p, r)
