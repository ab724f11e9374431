"""The layout rules of host offloading: how many of a rank's layers may send their activations
to the host (offload_limit, check_offload), what Megatron-Core runs beside its layer-level CPU
offloading (offload_refusal), and which modules its fine-grained offloading may park
(check_offload_modules). Apart from layout.py, whose check_layout applies them to one layout;
search applies them across its offload choices (search._with_offload)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import LayoutError

if TYPE_CHECKING:
    from .layout import Layout


def check_offload_modules(modules, cuda_graphs, fused_kernels: bool) -> None:
    """Raise LayoutError where Megatron-Core's fine-grained activation offloading cannot run as
    asked (Megatron-LM's "Fine-Grained Activation Offloading" guide, 2026): attn_proj shares its
    input with core_attn's output, so it goes with core_attn; the norms sit on CUDA graphs'
    boundaries, so they stay where graphs are captured; and it is a Megatron-Core feature, not
    piper-train's (eager modules)."""
    mods = set(modules)
    if not mods:
        return
    if not fused_kernels:
        raise LayoutError("offload_modules needs fused kernels", "fine-grained activation offloading is "
                          "Megatron-Core's; eager modules (fused_kernels false, piper-train) keep their activations")
    if "attn_proj" in mods and "core_attn" not in mods:
        raise LayoutError("offload_modules attn_proj with core_attn", "the output projection's input is the core "
                          "attention's output: offload both or neither")
    norms = sorted(mods & {"attn_norm", "mlp_norm"})
    if norms and cuda_graphs:
        raise LayoutError("offload_modules without norms under CUDA graphs", f"{', '.join(norms)} cross the "
                          "captured graphs' boundaries; Megatron-Core offloads them only without cuda_graphs")


def offload_limit(num_layers: int, pp):
    """The most layers a rank of `pp` pipeline stages can offload (ints or arrays): all it holds
    but one, since the last layer's activations stay (Transformer Engine offloads at most
    model_layers - 1 layers, and overlaps its copies only from model_layers - 2 down)."""
    return -(-num_layers // pp) - 1


def check_offload(lay: Layout, num_layers: int) -> None:
    """Raise LayoutError where activation offload names more layers than a rank can send away
    (offload_limit), or where Megatron-Core, the stack that runs it, refuses it (offload_refusal)."""
    most = offload_limit(num_layers, lay.pp)
    if lay.offload_layers and lay.offload_layers > most:
        raise LayoutError("offload_layers < layers on a rank", f"offload_layers={lay.offload_layers} but a rank "
                          f"holds {most + 1} of the {num_layers} layers (pp={lay.pp}); at most {most}")
    if lay.offload_layers and (why := offload_refusal(lay.pp, lay.recompute, lay.cuda_graphs, lay.offload_modules)):
        raise LayoutError(*why)


def offload_refusal(pp: int, recompute: str, cuda_graphs, offload_modules) -> tuple[str, str] | None:
    """(rule, detail) where Megatron-Core refuses its layer-level CPU offloading (offload_layers > 0)
    beside these settings, else None: TransformerConfig.__post_init__ raises "Currently there is no
    support for Pipeline parallelism with CPU offloading", "CPU offloading does not work when
    activation recomputation is enabled", "CUDA graphs not supported with CPU offloading" and
    "fine_grained_activation_offloading cannot be enabled with cpu_offloading"."""
    if pp > 1:
        return "offload_layers with pp 1", f"Megatron-Core's CPU offloading runs no pipeline; got pp={pp}"
    if recompute != "none":
        return "offload_layers without recompute", f"Megatron-Core's CPU offloading runs no recompute; got {recompute}"
    if cuda_graphs:
        return "offload_layers without cuda_graphs", "Megatron-Core captures no CUDA graphs beside CPU offloading"
    if offload_modules:
        return ("offload_layers or offload_modules, not both", "Megatron-Core's layer and fine-grained activation "
                "offloading exclude each other")
    return None
