"""The checks the planning commands (estimate, search, sweep) make of their options and specs
before anything is priced: the peaks and machine size a spec must give, the headroom and gradient
dtype asked for, options that say nothing for the model (the routed experts' on a dense one,
migration's settings without it), and a borrowed routing histogram."""
from __future__ import annotations

import click


def warn_histogram(model, routing, source: str) -> None:
    """Say so where a measured histogram is not this model's own: the run's summary names another
    model spec, or it has another count of MoE layers (a routing shape borrowed from another run,
    averaged over its layers)."""
    from .cost.migration import metrics_model
    from .plan import spec_hash

    h = routing.histogram
    ran = metrics_model(source) if h is not None else None
    own = spec_hash(model) if ran is not None else None
    if ran is not None and ran[1] != own:
        click.echo(f"warning: {source}: model_hash: the run trained {ran[0] or 'another spec'} "
                   f"({ran[1]}), not this {model.name} ({own}); its routing is another model's", err=True)
    if h is not None and model.moe is not None and len(h) != model.num_moe_layers and \
            len(h[0]) == model.moe.num_experts:  # (another expert count is an error, raised where it is priced)
        click.echo(f"warning: {source}: tokens_per_expert: {len(h)} MoE layer(s) measured, {model.name} has "
                   f"{model.num_moe_layers}; their average popularity is applied to every layer", err=True)


def check_peaks(hw, ref: str, kw) -> None:
    """The spec must give the peak the options' GEMMs run at (--dtype's, and fp8's for an --fp8
    recipe) and the plateau of the attention kernel they run (--attention fa2): one line naming the
    file, before anything is priced."""
    from .specs.registry import _resolve

    # every FP8 recipe runs at the fp8 peak, and so does FP8 attention
    need = [kw["dtype"]] + (["fp8"] if kw["fp8"] != "none" or kw.get("attention_fp8") else [])
    hw.require_peaks(need, str(_resolve(ref, "hardware")))
    hw.require_attention(kw["attention"], str(_resolve(ref, "hardware")))


def check_machine_size(hw, source: str, gpus: int, said: set | None = None) -> None:
    """Say so where -n is beyond the machine the spec describes (its max_gpus). A warning, not an
    error: a larger machine of the same parts is a fair question (the topology's top level prices it,
    more of its network). An error where that top level is no network (not via_nic: a node, an NVL72
    rack): it would price the GPUs beyond it as if inside it. `said`: warnings already given (a sweep's
    scenarios), each given once."""
    from .errors import SpecError

    top = hw.topology[-1]
    if gpus > top.size and not top.via_nic:
        raise SpecError(source, "topology", f"-n {gpus} is beyond its top level {top.name!r} ({top.size} GPUs), "
                        "which is no network: expected a via_nic level above it to price traffic between its domains")
    if hw.max_gpus and gpus > hw.max_gpus:
        line = (f"warning: {source}: max_gpus: the machine has {hw.max_gpus} GPUs; -n {gpus} is priced as a "
                "larger machine of the same parts")
        if said is None or line not in said:
            click.echo(line, err=True)
            if said is not None:
                said.add(line)


def check_headroom(hw, headroom_gib: float) -> None:
    """A headroom of the whole device memory or more leaves no layout anything to fit in: said in
    one line, not as a search whose every layout is refused. (A sweep that varies the memory
    checks it against its scenario with the most.)"""
    from .errors import PiperError

    mem = hw.accelerator.memory_gib
    if headroom_gib >= mem:
        raise PiperError(f"--headroom-gib: {headroom_gib:g} GiB leaves nothing of {hw.name}'s {mem:g} GiB a GPU; "
                         f"expected less than {mem:g}")


def check_grad_dtype(kw) -> None:
    """bf16 gradients of fp32 weights are not a reduction any runtime makes: the gradients of an
    fp32 model are fp32 (memory.py prices them so), and the plan would say bf16."""
    from .errors import PiperError

    if kw.get("grad_dtype") == "bf16" and kw.get("dtype") == "fp32":
        raise PiperError("--grad-dtype bf16: the gradients of --dtype fp32 weights are fp32; use --grad-dtype fp32")


# options that price the routed experts alone (their exchange, placement, load, GEMMs, re-placement
# and its migration_* settings): on a model without experts a value other than the default says
# nothing, and is refused there as --ep > 1 and --etp > 1 are (layout.check_degrees), not priced as
# if it had been left out
EXPERT_OPTIONS = ("a2a", "placement", "routing", "expert_gemm", "expert_probs", "a2a_overlap", "a2a_sms",
                  "ep_in_domain", "etps", "migration")


def refuse_expert_options(model, kw) -> None:
    from .errors import PiperError

    if model.moe is not None:
        return
    for flag, given in _set_options(kw, lambda name: name in EXPERT_OPTIONS or name.startswith("migration_")):
        raise PiperError(f"{given}: {model.name} has no routed experts, whose {flag.lstrip('-')} it sets; "
                         "leave it out for a dense model")


def refuse_no_ops(lay, kw, gpus_per_node: int) -> None:
    """One layout's options that would do nothing as given, in one line (estimate; a search tries
    them across layouts, some of which read them): an exchange or placement at ep 1, HALO where no
    EP group has several members on each of several nodes, a ZeRO stage given with no data-parallel
    rank to shard over, the tensor-parallel overlap at tp 1, the all-to-all's compute units where no
    all-to-all hides behind compute (cost.estimate reads them beside an overlapped exchange or under
    dualpipev)."""
    from click.core import ParameterSource

    from .errors import PiperError

    hides = lay.schedule == "dualpipev" or (lay.a2a_overlap and lay.ep > 1)
    ctx = click.get_current_context(silent=True)
    zero_given = ctx is not None and ctx.get_parameter_source("zero") == ParameterSource.COMMANDLINE
    for given, no_op, why in (
            (f"--a2a {kw['a2a']}", kw["a2a"] not in ("auto", "flat") and lay.ep == 1, "no expert exchange at ep 1"),
            ("--a2a halo", lay.a2a == "halo" and lay.ep > 1 and not halo_aggregates(lay, gpus_per_node),
             f"no EP group has several members on each of several nodes of {gpus_per_node} GPUs (HALO runs "
             "and is priced as the flat exchange there)"),
            (f"--zero {lay.zero}", zero_given and lay.zero > 0 and lay.dp * lay.cp == 1 and lay.edp <= 1,
             "no data-parallel rank to shard over at dp·cp 1 and expert dp 1"),
            ("--placement spread", kw["placement"] == "spread" and lay.ep == 1, "no expert group to place at ep 1"),
            ("--tp-comm-overlap", lay.tp_comm_overlap and lay.tp == 1, "no tensor-parallel collective at tp 1"),
            (f"--a2a-sms {lay.a2a_sms}", lay.a2a_sms is not None and not hides,
             "no all-to-all hides behind compute (--a2a-overlap with ep > 1, or dualpipev)")):
        if no_op:
            raise PiperError(f"{given}: {why}, so it does nothing; leave it out")


def halo_aggregates(lay, gpus_per_node: int) -> bool:
    """Whether some EP group of `lay` (layout.rank_indices' ep_group) has members on between 2 and
    ep - 1 nodes: the only groups HALO aggregates; one node, or one member a node, runs the flat
    exchange (runtime/train.make_exchange) and is priced as it."""
    import numpy as np

    from .layout import rank_indices

    node = np.arange(lay.gpus) // gpus_per_node
    nodes = int(node[-1]) + 1
    spans = np.bincount(np.unique(rank_indices(lay)["ep_group"] * nodes + node) // nodes)  # nodes a group spans
    return bool(np.any((spans > 1) & (spans < lay.ep)))


def check_migration_settings(kw) -> None:
    """A --migration-* setting without --migration is a forgotten --migration, not a no-op."""
    from .errors import PiperError

    if kw["migration"]:
        return
    for _, given in _set_options(kw, lambda name: name.startswith("migration_")):
        raise PiperError(f"{given}: it sets expert migration, which is off; add --migration")


def _set_options(kw, which):
    """(flag, the flag as given) of the running command's options `which` names that `kw` sets
    other than their default."""
    for p in click.get_current_context().command.params:
        if which(p.name) and p.name in kw and kw[p.name] != p.default:
            flag = max(p.opts, key=len)
            yield flag, flag if kw[p.name] is True else f"{flag} {kw[p.name]}"
