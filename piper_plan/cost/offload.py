"""Host offloading: optimizer state stepped on the CPU, activations parked in host memory.

Optimizer (Layout.optimizer_offload = f, Megatron-Core's HybridDeviceOptimizer,
megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py): the first f of a rank's
distributed-optimizer shard keeps its fp32 master weights in pinned host memory, and torch's
AdamW (fused=True) on the CPU keeps its moments there too. Each step copies those gradients
device -> host in fp32 (the main_grad buffer), steps AdamW over them on the host (reads p, g,
m, v: 16 B; writes p, m, v: 12 B), and copies the weights back to the bf16 model parameters
(PyTorch converts dtypes on the CPU for CPU-GPU copies: read 4 B, write 2 B, then 2 B cross).
Priced without Megatron's optional d2h/h2d overlap: link time plus host-DRAM time; on
Megatron-Bridge's measurement the overlap saved ~7 % because "CPU-side Adam compute — not the
transfers — was the dominant bottleneck" (docs/training/cpu-offloading.md). The host DRAM rate
is a floor for that compute (a STREAM rate), so the price is a lower bound where the CPU's
cores, not its memory, bound the step.

Activations by module (Layout.offload_modules, Megatron-Core's fine-grained activation
offloading): in every layer the listed modules' saved tensors (activations.OFFLOAD_TERMS) go to
pinned host memory on a side stream after the module's forward and come back before its backward,
one layer's groups staying on the device (rank_memory.role_activations); the copies run behind the
rank's compute like the whole layers' below.

Activations (Layout.offload_layers = L, Transformer Engine's CPU offloading,
transformer_engine/pytorch/cpu_offload.py): the saved activations of L of a rank's layers go to
the host as soon as they are saved and come back one layer ahead in the backward, on a side
stream; "peak saved-activation memory is (num_layers - num_offloaded_layers) * T". A rank's
copies run behind its own compute: per micro-batch, the forward's copies out behind its
forward, the backward's copies in behind its backward; only what is left over shows. Both
directions move over the host link and through the host's DRAM, at the slower of the two.

Units: bytes, seconds; rates GB/s per GPU and direction (HardwareSpec.host).
"""
from __future__ import annotations

import numpy as np

from ..errors import PiperError
from ..specs.hardware import HardwareSpec
from .batch import LayoutBatch

# host-side bytes per offloaded parameter and step: AdamW's 28, the fp32 -> bf16 cast before the
# copy back (6), the gradient's DMA write (4) and the weight's DMA read (2)
HOST_DRAM_BYTES = 28.0 + 6.0 + 4.0 + 2.0
# bytes per offloaded parameter over the link: the fp32 gradient out, the bf16 weight back
LINK_OUT_BYTES, LINK_IN_BYTES = 4.0, 2.0


def parks_activations(lay: LayoutBatch) -> bool:
    """Whether any layout sends saved activations to the host (Layout.offload_layers, offload_modules)."""
    return bool(np.any(lay.offload_layers > 0) or np.any(lay.off_mods))


def uses_host(lay: LayoutBatch) -> bool:
    """Whether any layout keeps optimizer state or activations in host memory."""
    return bool(np.any(lay.opt_offload > 0)) or parks_activations(lay)


def require_host(hw: HardwareSpec, lay: LayoutBatch) -> None:
    """Raise PiperError where a layout offloads and the hardware spec says nothing of its host."""
    check_host(hw, uses_host(lay))


def check_host(hw: HardwareSpec, offloads: bool) -> None:
    """Raise PiperError where something `offloads` and the hardware spec says nothing of its host."""
    if hw.host is None and offloads:
        raise PiperError(f"hardware {hw.name}: host: offloading (optimizer_offload, offload_layers, offload_modules) "
                         "needs the spec's host section (link_gbps, memory_bandwidth_gbps, memory_gib)")


def optimizer_offload_time(hw: HardwareSpec, lay: LayoutBatch, owned) -> np.ndarray:
    """Seconds per step the host's share of the optimizer adds: `owned` parameters a rank steps
    (its optimizer shard), lay.opt_offload of them on the host."""
    if hw.host is None:
        return np.zeros(len(lay))
    n = lay.opt_offload * np.asarray(owned, dtype=float)
    link = (LINK_OUT_BYTES + LINK_IN_BYTES) * n / (hw.host.link_gbps * 1e9)
    dram = HOST_DRAM_BYTES * n / (hw.host.memory_bandwidth_gbps * 1e9)
    return link + dram


def activation_copy_time(hw: HardwareSpec, nbytes) -> np.ndarray:
    """Seconds to move `nbytes` one way between a GPU and its host (the slower of the link and
    the host DRAM share)."""
    if hw.host is None:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    rate = min(hw.host.link_gbps, hw.host.memory_bandwidth_gbps) * 1e9
    return np.asarray(nbytes, dtype=float) / rate


def offloaded_share(lay: LayoutBatch, layers) -> np.ndarray:
    """Share of a rank's layer activations on the host: offload_layers of its `layers`, all but
    one at most (Transformer Engine keeps the last layer's on the device: layout_offload.offload_limit).
    The limit is checked against the ranks' mean, ceil(L / pp); a balanced split gives some rank
    fewer layers, which would otherwise park everything."""
    layers = np.maximum(np.asarray(layers, dtype=float), 1.0)
    return np.minimum(lay.offload_layers, layers - 1.0) / layers


def exposed_copies(hw: HardwareSpec, nbytes, fwd, bwd) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per micro-batch that the activation copies of `nbytes` (each
    way) leave exposed beyond a rank's forward (`fwd`) and backward (`bwd`) compute of it."""
    t = activation_copy_time(hw, nbytes)
    return np.maximum(0.0, t - fwd), np.maximum(0.0, t - bwd)
