"""A piper-train step reads device values back to the host twice from its own code: the step's
record (every MoE statistic and loss in one copy) and the gradient norm. On a GPU each readback
waits for the device; the H200 profile of a Granite step counted 650 before the MoE permutation
lost its synchronisations and 138 before the record was read in one copy (README, "piper-train
on one GPU"). Counted here on one CPU rank planned on a GPU spec (its experts' rows unpadded, as
on a GPU), with the Tensor methods that copy values to the host patched; torch's own readbacks
(the pipeline schedule's, the object collectives') are not piper-train's to remove."""
from __future__ import annotations

import collections
import json
import os
import traceback

import pytest

torch = pytest.importorskip("torch")

import torch.multiprocessing as mp  # noqa: E402

import piper_runtime  # noqa: E402

# where piper-train's code is imported from (the checkout, or site-packages when installed so)
RUNTIME = os.path.realpath(os.path.dirname(piper_runtime.__file__))

READBACKS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
STEPS = 3


def _worker(rank: int, store: str, plan_path: str, out: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from piper_plan.plan import read_plan
    from piper_runtime.config import TrainConfig
    from piper_runtime.train import train

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    sites = collections.Counter()

    def recording(name, orig):
        def f(self, *a, **k):
            frame = traceback.extract_stack(limit=3)[-2]
            path = os.path.realpath(frame.filename)
            if path.startswith(RUNTIME):
                sites[f"{os.path.relpath(path, RUNTIME)}:{frame.lineno} {name}"] += 1
            return orig(self, *a, **k)
        return f

    for name in READBACKS:
        setattr(torch.Tensor, name, recording(name, getattr(torch.Tensor, name)))
    try:
        train(read_plan(plan_path), TrainConfig(steps=STEPS, log_every=0), torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(dict(sites), f)


def test_a_step_reads_back_twice_from_piper_train_s_own_code(tmp_path, monkeypatch):
    from piper_plan.evaluate import build_plan, estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.plan import write_plan
    from piper_plan.specs import load_hardware, load_model

    spec, hw = load_model("tiny-moe"), load_hardware("dgx-h100")
    lay = Layout(gpus=1, global_batch=4, mbs=2, seq=32, dtype="bf16", zero=0, fused_kernels=False)
    plan = tmp_path / "plan.json"
    write_plan(build_plan(spec, hw, lay, estimate_layout(spec, hw, lay)), plan)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an inherited value must not win, nor this one leak
    out = tmp_path / "sites.json"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(plan), str(out)), nprocs=1, join=True)
    sites = json.loads(out.read_text())
    per_step = {k: v / STEPS for k, v in sites.items()}
    assert sorted(per_step.values()) == [1.0, 1.0], per_step
    assert any(k.startswith("metrics.py") and k.endswith("tolist") for k in per_step), per_step
    assert any(k.startswith("optim.py") for k in per_step), per_step
