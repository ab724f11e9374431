"""HardwareSpec: an accelerator, its efficiency model, and a topology of levels.

Units: memory GiB (2^30 bytes); bandwidth GB/s (10^9 bytes/s) per GPU and per direction;
latency microseconds; peak rates dense TFLOP/s (10^12 FLOP/s) per accelerator (a GCD on
Frontier). Every figure in a bundled YAML carries its source next to it.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from ..errors import SpecError
from .base import _Optional, _Strict

# ranges a figure must lie in, wide (beyond them the step time overflows to inf or NaN): bandwidths from
# 1 MB/s to 1 ZB/s (a CPU calibration's in-cache "link" between two ranks reads ~1.4e7 GB/s), fixed costs
# up to 10 s
MIN_GBPS, MAX_GBPS, MAX_US = 1e-3, 1e12, 1e7
MAX_GPUS = 1 << 24  # the most GPUs a spec or a command names (clitypes.GPU_COUNT): sizes stay in int64 arithmetic
# efficiency fractions and tapers from 1e-3 to 1: a kernel or collective reaching under a thousandth of
# its peak, or a level left a thousandth of the NIC rate, is a typo, not a machine (the bundled specs'
# lowest: a cross-rail taper of 0.07, an attention plateau of 0.13); 1e-300 overflowed the step time
MIN_FRACTION = 1e-3
MAX_GIB = 1 << 20  # memory figures (GiB) up to 1 PiB a device or host: any larger is a typo's extra digits


# the element types a peak may be stated for (the planner prices bf16/fp16/fp32 and the FP8 recipes)
PEAK_DTYPES = frozenset({"bf16", "fp16", "fp32", "tf32", "fp8", "fp6", "fp4", "int8", "mxfp8", "mxfp4", "nvfp4",
                         "fp8_blockwise"})


class Accelerator(_Optional):
    _OMIT_AT_DEFAULT = ("ranks_per_core", "expert_row_multiple", "cache_mib", "fp8_any_layout", "gfx_arch")

    name: str = Field(min_length=1)
    memory_gib: float = Field(..., gt=0, le=MAX_GIB, description="device memory, GiB")
    peak_tflops: dict[str, float] = Field(..., description="dense peak TFLOP/s by dtype (bf16, fp16, fp8, fp32)")
    memory_bandwidth_gbps: float = Field(..., ge=MIN_GBPS, le=MAX_GBPS, description="HBM bandwidth, GB/s")
    cache_mib: Optional[float] = Field(
        None, gt=0, le=MAX_GIB * 1024, description="working set (MiB) that streams at efficiency.memory; bytes beyond "
        "it go at efficiency.memory_dram (a CPU rank's cache share, measured by calibrate; None: one rate)")
    compute_units: int = Field(..., ge=1, le=1 << 20, description="SMs / CUs: GEMM tiles run in waves of this many")
    ranks_per_core: float = Field(  # (le: no more ranks share a core than a spec has GPUs)
        1.0, ge=1, le=MAX_GPUS, description="CPU ranks only: local ranks per physical core (ranks / cores) when ranks "
        "share cores. The rates of such a spec are per rank with every rank busy, so time one rank spends idle (a "
        "pipeline bubble) can run the others; >1 makes the step max(critical path at these rates, mean busy "
        "time per rank); a layout with fewer ranks a node than gpus_per_node runs each at a larger share of a "
        "core (cost.estimate.core_share). 1: a rank owns its device (GPUs)")
    expert_row_multiple: int = Field(
        1, ge=1, description="the runtime pads each local expert's routed rows with zero rows to a multiple of "
        "this before its GEMMs (piper-train on CPU ranks: 16, so the CPU GEMM library, which builds a kernel "
        "per new shape, meets few shapes); the planner prices the expected padding. 1: no padding")
    fp8_any_layout: bool = Field(
        False, description="its FP8 GEMMs take operands in any layout (Transformer Engine's "
        "nvte_is_non_tn_fp8_gemm_supported: compute capability 10.x and 13+), so a tensor-scaled FP8 weight keeps "
        "one copy; false: FP8 GEMMs take only the TN layout (Hopper) and TE keeps each weight's transpose too")
    compute_capability: Optional[float] = Field(
        None, gt=0, description="CUDA compute capability (8.0 A100, 9.0 Hopper, 10.0 B200, 10.3 B300): runtimes "
        "choose settings by it (Megatron-LM runs one hardware work queue, CUDA_DEVICE_MAX_CONNECTIONS=1, below "
        "10 with tensor or context parallelism: validate._p2p_overlap); None: not an NVIDIA GPU")
    gfx_arch: Optional[str] = Field(
        None, pattern=r"^gfx[0-9a-f]{3,4}$", description="AMD GPU architecture as ROCm names it (gfx90a MI250X, "
        "gfx942 MI300X, gfx950 MI355X): ROCm's Transformer Engine runs MXFP8 from gfx950 "
        "(layout.fp8_hw_refusal); None: not an AMD GPU, or not stated")
    source: str = ""

    @model_validator(mode="after")
    def _one_vendor(self):
        if self.gfx_arch is not None and self.compute_capability is not None:
            raise ValueError("gfx_arch (an AMD GPU) and compute_capability (an NVIDIA GPU) cannot both be set")
        return self

    @model_validator(mode="after")
    def _peaks(self):
        if "bf16" not in self.peak_tflops:
            raise ValueError("peak_tflops needs a bf16 entry")
        unknown = sorted(set(self.peak_tflops) - PEAK_DTYPES)
        if unknown:  # a misspelt dtype (BF16, bfloat16) would sit beside the real one, never read
            raise ValueError(f"peak_tflops keys must be among {', '.join(sorted(PEAK_DTYPES))}; not {unknown}")
        for k, v in self.peak_tflops.items():
            if not 1e-6 <= v <= 1e7:  # (a TFLOP/s of 1e-300 or 1e300 overflows the step time)
                raise ValueError(f"peak_tflops.{k} must be in [1e-6, 1e7] TFLOP/s")
        return self


class AttentionBlocks(_Strict):
    """How a fused attention kernel's rate moves with the shape of its mask. The kernel walks
    tiles of `block` queries by `block` keys, computes every tile its mask touches whole (the causal
    diagonal's too) and pays a fixed cost for each query block's pass (loading its queries, the
    softmax's last rescale, writing its output), worth `forward` / `backward` tiles of work. Its
    plateaus (Efficiency.attention, attention_bwd) were measured causal at `seq` tokens; other
    lengths, windows and context-parallel ring steps are priced against that (cost.kernels.tile_cost)."""

    forward: float = Field(..., ge=0, le=1000, description="the forward's fixed cost a query block's pass, in tiles")
    backward: Optional[float] = Field(
        None, ge=0, le=1000, description="the backward's, in tiles; None: as `forward`")
    block: int = Field(128, ge=1, le=1 << 16, description="the kernel's tile edge, tokens")
    seq: int = Field(4096, ge=1, le=1 << 30, description="the causal sequence length the plateaus were measured at")

    @model_validator(mode="after")
    def _one_block_at_least(self):
        if self.seq < self.block:  # a plateau measured inside one tile says nothing of the passes
            raise ValueError(f"seq ({self.seq}) must be at least block ({self.block})")
        return self


class AttentionPlateau(_Optional):
    """One fused attention kernel's plateaus, where a stack runs another kernel than the one
    `Efficiency.attention` measures (Layout.attention_kernel fa2: FlashAttention-2)."""

    _OMIT_AT_DEFAULT = ("blocks",)  # a spec stating none dumps (and hashes) as before the field

    forward: float = Field(..., ge=MIN_FRACTION, le=1, description="forward's fraction of dense peak")
    backward: Optional[float] = Field(
        None, ge=MIN_FRACTION, le=1, description="backward's fraction of dense peak, counting 2.5x the forward's "
        "FLOPs; None: as `forward`")
    softmax_share: float = Field(
        0.0, ge=0, le=1, description="share of its time at Efficiency.attention_head_dim spent on the softmax work "
        "of its score elements (Efficiency.attention_softmax_share, for this kernel)")
    blocks: Optional[AttentionBlocks] = Field(
        None, description="this kernel's fixed cost a query block's pass (Efficiency.attention_blocks, for this "
        "kernel); None: one rate whatever the length and mask")


class Efficiency(_Optional):
    """Achievable fractions of the peaks. Physical terms (roofline, wave quantisation,
    launch overhead) are modelled separately, so these are the plateau values a large,
    well-shaped kernel reaches — taken from published micro-benchmarks, not fitted to
    training throughput.

    The three fixed costs below (neutral defaults: 0) are measured by `piper-plan calibrate`
    on machines where they matter (a CPU running eager torch): they are per call, not per
    byte, so they dominate small models and vanish for large ones."""

    _OMIT_AT_DEFAULT = ("gemm_dtype", "gemm_overhead_us", "layer_overhead_us", "collective_overhead_us", "attention_bwd",
                        "attention_bwd_row_us", "memory_dram", "pipeline_chunk_us", "collective_step_us", "cast",
                        "a2a_fanout", "overlap_comm_units", "host_op_us", "quant_memory", "attention_head_dim",
                        "attention_softmax_share", "sustained_matmul", "attention_fp8", "dglu_dbias_ps",
                        "attention_fa2", "attention_blocks")

    gemm: float = Field(..., ge=MIN_FRACTION, le=1, description="large-GEMM fraction of dense peak")
    gemm_dtype: dict[str, float] = Field(
        default_factory=dict, description="large-GEMM fraction of that dtype's dense peak where it differs from "
        "`gemm` (e.g. fp8 on Hopper reaches a smaller share of its doubled peak), keyed by dtype, or by FP8 recipe "
        "(mxfp8, fp8_blockwise) where its block-scaled GEMMs run below the dtype's")
    gemm_tile: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = Field(
        (128, 128), strict=False, description="output tile (m, n) for wave quantisation (default: an "
        "assumption; every bundled GPU spec states its own)")  # a YAML list is a tuple
    attention: float = Field(..., ge=MIN_FRACTION, le=1, description="fused (flash) attention fraction of dense peak")
    # (a speed over bf16's: FP8 doubles the tensor peak, so a factor past 10 either way is a typo)
    attention_fp8: Optional[tuple[Annotated[float, Field(ge=0.1, le=10)],
                                  Annotated[float, Field(ge=0.1, le=10)]]] = Field(
        None, strict=False, description="FP8 fused attention's speed over bf16's, (forward, backward), at sequence "
        "4096 (Transformer Engine's fp8_dot_product_attention, Layout.attention_fp8); None: priced as bf16")
    attention_fa2: Optional[AttentionPlateau] = Field(
        None, description="FlashAttention-2's plateaus on this accelerator (Layout.attention_kernel fa2: PyTorch "
        "SDPA's flash backend, which torch 2.5.1-2.10 run on Hopper, where Transformer Engine runs cuDNN's kernel, "
        "the one `attention` measures); None: not measured, and a layout asking for it is refused")
    attention_blocks: Optional[AttentionBlocks] = Field(
        None, description="the fused kernel's (`attention`'s) fixed cost a query block's pass, which makes it "
        "faster per FLOP on long sequences and slower in narrow windows and context-parallel ring steps; None: "
        "one rate whatever the length and mask (not measured)")
    attention_bwd: Optional[float] = Field(
        None, ge=MIN_FRACTION, le=1, description="fused attention backward's fraction of dense peak, counting 2.5x the "
        "forward's FLOPs (FlashAttention-2's five GEMMs to the forward's two); None: as `attention`")
    attention_head_dim: Optional[int] = Field(  # (le: the model spec's MAX_WIDTH)
        None, gt=0, le=1 << 20, description="head dimension the attention plateaus were measured at; narrower heads "
        "run slower per FLOP (cost.kernels.head_dim_slowdown). None: not known, no head-dim term")
    attention_softmax_share: float = Field(
        0.0, ge=0, le=1, description="share of a fused attention kernel's time at attention_head_dim spent on the "
        "softmax work of its score elements (which does not shrink with the head)")
    attention_bwd_row_us: float = Field(
        0.0, ge=0, le=MAX_US, description="fixed cost of the attention backward per query row per head, us (a CPU "
        "kernel pays it whatever the sequence length: measured by calibrate)")
    sustained_matmul: float = Field(
        1.0, ge=MIN_FRACTION, le=1, description="tensor-core throughput a GPU holds once saturated at its power "
        "limit, as a fraction of the short-burst rate at boost clock that `gemm`, `gemm_dtype` and the attention "
        "plateaus were measured at (e.g. ml-engineering's MSMF / MAMF: sustained best-shape matmul over the burst "
        "one): a training step keeps the tensor cores busy for seconds, so its GEMMs and fused attention run at "
        "the sustained rate. 1.0: not measured, no throttle priced")
    dglu_dbias_ps: float = Field(  # (le: a microsecond an element written is a typo; measured: 23 ps)
        0.0, ge=0, le=1e6, description="picoseconds the fused grouped-MLP backward kernel (cuDNN frontend's "
        "grouped_gemm_dglu with dbias: fc2's dgrad GEMM, a GLU's backward and fc1's bias gradient in its epilogue; "
        "Layout.expert_gemm grouped, gated experts with biases) spends beyond that GEMM per element of the GLU "
        "input gradient it writes (rows x 2f/etp), where a library release runs its bias-gradient reduction slowly "
        "(NVIDIA/cudnn-frontend#256). 0: the epilogue rides the GEMM")
    memory: float = Field(0.85, ge=MIN_FRACTION, le=1, description="fraction of HBM bandwidth streaming kernels "
                          "reach (default 0.85: an assumption; every bundled GPU spec states its own, with its source)")
    quant_memory: Optional[float] = Field(
        None, ge=MIN_FRACTION, le=1, description="fraction of HBM bandwidth an FP8 quantisation kernel (cast with its "
        "scales, row- and column-wise) reaches, where measured below `memory` (None: as `memory`)")
    memory_dram: Optional[float] = Field(
        None, ge=MIN_FRACTION, le=1, description="fraction of memory_bandwidth_gbps for the bytes of a working set "
        "beyond accelerator.cache_mib (None: as `memory`)")
    cast: Optional[float] = Field(
        None, ge=MIN_FRACTION, le=1, description="dtype casts of weights and gradients (fp32 <-> bf16 into fresh "
        "tensors) as a fraction of the streaming model's rate for the same bytes (None: at that rate); measured by "
        "calibrate on CPUs, where the conversion kernel, not memory, sets the pace")
    kernel_overhead_us: float = Field(4.0, ge=0, le=MAX_US, description="fixed cost per kernel launch, us "
        "(default 4: an assumption; every bundled GPU spec states its own, with its source)")
    comm: float = Field(0.85, ge=MIN_FRACTION, le=1, description="fraction of link bandwidth large collectives reach "
        "(default 0.85: an assumption; every bundled GPU spec states its own, with its source)")
    a2a_fanout: Optional[float] = Field(
        None, ge=MIN_FRACTION, le=1, description="fraction of the NIC rate that the library's all-to-all reaches "
        "across nodes when every rank posts a message to each of its remote peers at once (the fan-out of "
        "NCCL/RCCL all_to_all; HALO's Phase II instead sends one pack to each remote node's same-index peer "
        "and runs at `comm`); None: as `comm`")
    overlap_comm_units: int = Field(  # (le: compute_units' own bound)
        0, ge=0, le=1 << 20, description="compute units (SMs) the communication kernels of an all-to-all hold while "
        "it runs beside compute (Layout.a2a_overlap, dualpipev): that compute runs on the other units, so each second "
        "of hidden all-to-all costs units_held / compute_units seconds of compute. 0: not measured")
    host_op_us: float = Field(
        0.0, ge=0, le=MAX_US,
        description="CPU time the host spends issuing one operation of an eager training step (a "
        "Transformer Engine / Megatron-Core module call: Python, autograd, allocation, launch), us: a layer pass "
        "lasts at least its operations x this (cost/host.py). 0: not measured, no host floor (CPU specs: the "
        "host is the device, and calibrate's layer_overhead_us holds that cost)")
    gemm_overhead_us: dict[str, float] = Field(
        default_factory=dict, description="extra fixed cost per GEMM call by dtype, us, on top of "
        "kernel_overhead_us (a CPU's bf16 GEMM repacks its operands on every call)")
    layer_overhead_us: dict[str, float] = Field(
        default_factory=dict, description="host cost of one transformer block's forward + backward per "
        "micro-batch that the kernel list does not price (Python, autograd bookkeeping, views, casts, "
        "routing bookkeeping), us, keyed '<dense|moe>_<dtype>' (e.g. 'moe_bf16')")
    pipeline_chunk_us: dict[str, float] = Field(
        default_factory=dict, description="added wall time per extra model chunk a rank runs per micro-batch "
        "under a multi-chunk schedule, beyond the chunk's layers and messages (the schedule executor's "
        "per-action work: stage bookkeeping, split input/weight backward passes), us, keyed by schedule "
        "('interleaved', 'zbv', 'dualpipev'); measured by calibrate against 1f1b on the same layers")
    optimizer_tensor_us: dict[str, float] = Field(
        default_factory=dict, description="host cost per parameter tensor of an eager (unfused) optimizer "
        "path beyond the bytes it streams, us, keyed 'adamw' (single-tensor AdamW step and the gradient's "
        "norm, per owned tensor), 'grad' (clip scale and ÷dp, per held gradient) and 'copy' (unpacking a "
        "flat collective buffer, per tensor reduced or gathered); measured by calibrate on piper-train's "
        "own functions (fused multi-tensor optimizers pay none of it)")
    collective_step_us: float = Field(
        0.0, ge=0, le=MAX_US,
        description="added wall time per dependent step of a ring all-reduce (2(n−1) steps, each "
        "waiting for one peer's message) while the ranks compute between calls, us, beyond the call's "
        "collective_overhead_us: on shared cores every step waits for its sender to be scheduled")
    collective_overhead_us: float = Field(
        0.0, ge=0, le=MAX_US,
        description="added wall time per collective call (all-to-all, p2p, all-reduce) while the "
        "ranks compute between calls, us: on shared cores each call waits for its peers to be scheduled")
    collective_skew_us: float = Field(
        0.0, ge=0, le=MAX_US,
        description="arrival skew: added wait per collective call per √ms of compute since the "
        "ranks last synchronised, beyond what collective_overhead_us holds at collective_skew_base_ms, "
        "us/√ms. Ranks whose progress jitters independently drift apart like a random walk, so the "
        "last one arrives σ·√W late (measured by calibrate on shared cores; 0: not measured)")
    collective_skew_base_ms: float = Field(  # (le: MAX_US, in ms)
        0.0, ge=0, le=MAX_US / 1e3, description="compute between calls at which collective_overhead_us was measured, "
        "ms: a call after W ms of compute adds collective_skew_us·(√W − √base) when W > base")
    source: str = ""

    @model_validator(mode="after")
    def _overheads(self):
        for name in ("gemm_overhead_us", "layer_overhead_us", "pipeline_chunk_us", "optimizer_tensor_us"):
            for k, v in getattr(self, name).items():
                if not 0 <= v <= MAX_US:
                    raise ValueError(f"{name}.{k} must be in [0, {MAX_US:g}] us")
        for k, v in self.gemm_dtype.items():
            if not MIN_FRACTION <= v <= 1:
                raise ValueError(f"gemm_dtype.{k} must be in [{MIN_FRACTION:g}, 1]")
        # a misspelt key would silently drop a measured cost: each dict names what it may hold
        allowed = {"optimizer_tensor_us": {"adamw", "grad", "copy"},
                   "layer_overhead_us": {f"{k}_{d}" for k in ("dense", "moe") for d in ("bf16", "fp16", "fp32")},
                   "pipeline_chunk_us": {"interleaved", "zbv", "dualpipev"}}
        for name, keys in allowed.items():
            unknown = set(getattr(self, name)) - keys
            if unknown:
                raise ValueError(f"{name} keys must be among {', '.join(sorted(keys))}; not {sorted(unknown)}")
        return self


class Level(_Optional):
    """One topology level: a domain of `size` GPUs. Traffic between two GPUs is carried by
    the smallest level containing both. Intra-node levels give their own per-GPU link
    bandwidth (unless `shared_links`); levels above the node go through the NICs (`via_nic`),
    possibly tapered."""

    _OMIT_AT_DEFAULT = ("shared_links", "comm", "mesh", "job_block", "a2a_comm")

    name: str = Field(min_length=1)
    size: int = Field(..., ge=1, le=MAX_GPUS, description="GPUs in one domain of this level")
    bandwidth_gbps: Optional[float] = Field(None, ge=MIN_GBPS, le=MAX_GBPS,
                                            description="per-GPU, per-direction GB/s (levels not via_nic: "
                                            "inside a node, or a scale-up fabric such as NVL72)")
    via_nic: bool = Field(False, description="traffic leaves the node through the NICs")
    shared_links: bool = Field(False, description="this level's traffic crosses the same per-GPU links as the "
                               "next level's (GB200 NVL72: the GPUs of one compute tray reach each other "
                               "through the NVLink switches too), so the two share one bandwidth budget")
    mesh: bool = Field(False, description="the level's GPUs are fully connected, one link per pair and no switch "
                       "(AMD's 8-GPU Infinity Fabric platforms): bandwidth_gbps is a GPU's all links together, and "
                       "traffic to k of its size-1 peers in the domain uses k/(size-1) of it")
    taper: float = Field(1.0, ge=MIN_FRACTION, le=1,
                         description="fraction of NIC injection bandwidth available at this level")
    latency_us: float = Field(..., ge=0, le=MAX_US, description="one-message latency, us")
    comm: Optional[float] = Field(None, ge=MIN_FRACTION, le=1, description="fraction of this level's bandwidth "
                                  "collectives reach where measured on the level itself (None: efficiency.comm)")
    a2a_comm: Optional[float] = Field(None, ge=MIN_FRACTION, le=1, description="fraction of this level's bandwidth "
                                      "an all-to-all's exchanges reach where measured apart from the ring "
                                      "collectives (None: comm); all-reduces, gathers and point-to-point messages "
                                      "keep comm")
    job_block: Optional[int] = Field(
        None, ge=1, le=MAX_GPUS, description="GPUs of one domain of this level that a job's consecutive ranks fill "
        "before moving to the next domain (a scheduler that places a large job 64 GPUs to an NVL72 rack: 64); "
        "groups are priced as these blocks of ranks hold them, at this level's bandwidth inside one. None: size, "
        "or where the level below sets one, as many as this level's domains of that level hold. Levels above "
        "the node and below the top only (HardwareSpec.job_blocks); capacity (max_gpus) still counts size")
    source: str = ""

    @model_validator(mode="after")
    def _bw(self):
        if not self.via_nic and self.bandwidth_gbps is None:
            raise ValueError(f"level {self.name!r}: intra-node level needs bandwidth_gbps")
        if self.mesh and (self.via_nic or self.size < 2):
            raise ValueError(f"level {self.name!r}: mesh needs a level of links between GPUs (not via_nic, size >= 2)")
        # figures a level of the other kind never reads: refused rather than silently dropped
        if self.via_nic and self.bandwidth_gbps is not None:
            raise ValueError(f"level {self.name!r}: a via_nic level moves at the NICs' rate (network.nic_gbps, its "
                             f"taper), so bandwidth_gbps={self.bandwidth_gbps:g} would be ignored")
        if not self.via_nic and self.taper != 1.0:
            raise ValueError(f"level {self.name!r}: taper={self.taper:g} applies to NIC bandwidth; a level not "
                             "via_nic gives its own bandwidth_gbps")
        if self.job_block is not None and self.job_block > self.size:
            raise ValueError(f"level {self.name!r}: job_block={self.job_block} exceeds the domain's size {self.size}")
        return self


class Network(_Strict):
    nics_per_node: int = Field(..., ge=1)
    nic_gbps: float = Field(..., ge=MIN_GBPS, le=MAX_GBPS, description="per-NIC, per-direction GB/s")
    nic_affinity: Optional[list[int]] = Field(None, description="NIC index of each local GPU (default: blocks)")
    rail_optimized: bool = Field(False, description="NIC l of every node sits on rail l; traffic between "
                                 "different NIC indices crosses a shared spine")
    cross_rail_taper: float = Field(1.0, ge=MIN_FRACTION, le=1, description="per-GPU share of NIC rate left for "
                                    "cross-rail traffic when every GPU sends across the spine at once")
    planes: int = Field(1, ge=1, description="separate networks (planes) each NIC's nic_gbps is split over, "
                        "one port on each (a ConnectX-8 on Spectrum-X: 2 x 400GbE); collectives that stripe "
                        "their channels over the ports (ring) reach nic_gbps, an all-to-all's per-peer "
                        "connections one plane's share (cost/comm.py)")
    source: str = ""


class Host(_Strict):
    """The host memory a GPU can offload to (cost/offload.py): the link between them and the
    share of the host's memory and DRAM bandwidth one GPU gets when every GPU offloads at once.
    Rates are achievable ones (measured copies, STREAM), each with its source."""

    link_gbps: float = Field(..., ge=MIN_GBPS, le=MAX_GBPS,
                             description="host<->device copy rate per GPU and direction with every "
                             "GPU of the host copying, GB/s (NVLink-C2C share, PCIe)")
    memory_bandwidth_gbps: float = Field(..., ge=MIN_GBPS, le=MAX_GBPS,
                                         description="host DRAM bandwidth per GPU (the host's STREAM "
                                         "rate over the GPUs that share it), GB/s")
    memory_gib: float = Field(..., gt=0, le=MAX_GIB, description="host memory per GPU, GiB")
    source: str = ""


class HardwareSpec(_Optional):
    _OMIT_AT_DEFAULT = ("host", "collectives")

    name: str = Field(min_length=1)
    source: str = ""
    accelerator: Accelerator
    efficiency: Efficiency
    gpus_per_node: int = Field(..., ge=1, le=MAX_GPUS)
    max_gpus: Optional[int] = Field(None, ge=1, le=MAX_GPUS, description="GPUs in the whole machine")
    network: Network
    topology: list[Level] = Field(..., min_length=1)
    memory_overhead_gib: float = Field(2.0, ge=0, le=MAX_GIB, description="framework/allocator reserve per "
        "GPU, GiB (default 2: an assumption, no published breakdown found: the CUDA context, NCCL's buffers and the "
        "caching allocator's held blocks; validate checks it against the published runs' memory, which it "
        "predicts to fit all but one of)")
    host: Optional[Host] = Field(None, description="host memory for optimizer-state and activation offload "
                                 "(None: the spec prices no offload)")
    collectives: Literal["nccl", "gloo"] = Field(
        "nccl", description="the collective library the runtime uses on this machine, whose algorithm prices a "
        "reduce to one root (cost/comm.py rooted): nccl (NCCL, RCCL: a pipelined chain, the whole buffer "
        "through the root once) or gloo (torch's CPU backend, gloo/reduce.cc: a ring reduce-scatter, then "
        "every rank sends its reduced chunk to the root, 2(n-1)/n of the buffer twice, as an all-reduce)")

    @model_validator(mode="after")
    def _topology(self):
        sizes = [lv.size for lv in self.topology]
        for j, (a, b) in enumerate(zip(sizes, sizes[1:])):
            # the top level (the whole machine) may hold a partial domain of the one below
            if b <= a or (b % a and j + 2 < len(sizes)):
                raise ValueError(f"topology sizes must grow and each divide the next (got {sizes})")
        if self.gpus_per_node not in sizes:
            raise ValueError(f"one topology level must be the node (size {self.gpus_per_node}); sizes are {sizes}")
        # the machine is whole nodes inside the topology (a variant with its own topology must say its size)
        if self.max_gpus is not None and (self.max_gpus > sizes[-1] or self.max_gpus % self.gpus_per_node):
            raise ValueError(f"max_gpus {self.max_gpus} must be whole nodes of {self.gpus_per_node} and at most the "
                             f"top topology level's {sizes[-1]}")
        seen_nic = False
        for i, lv in enumerate(self.topology):
            if lv.shared_links and (lv.via_nic or i + 1 == len(self.topology) or self.topology[i + 1].via_nic):
                raise ValueError(f"level {lv.name!r}: shared_links needs a next level that is not via_nic")
            inter = lv.size > self.gpus_per_node
            if not inter and lv.via_nic:
                raise ValueError(f"level {lv.name!r} is inside a node and cannot be via_nic")
            # a scale-up fabric (NVL72) may span nodes below the NIC levels, never above them
            if seen_nic and not lv.via_nic:
                raise ValueError(f"level {lv.name!r} sits above a via_nic level and must be via_nic too")
            seen_nic |= lv.via_nic
            if lv.mesh and inter:  # no switch, a link per pair: 8 GPUs of an AMD platform, not a fabric of nodes
                raise ValueError(f"level {lv.name!r}: mesh (a direct link between every pair of GPUs) spans one "
                                 f"node at most ({self.gpus_per_node} GPUs), got {lv.size}; a torus or other direct "
                                 "network between nodes is not modelled")
        self._job_blocks()
        if self.network.cross_rail_taper != 1.0 and not self.network.rail_optimized:
            raise ValueError("network.cross_rail_taper prices the spine between the rails of a rail-optimized fabric "
                             "(rail_optimized: true); a tapered spine of any fabric is topology[*].taper")
        aff = self.network.nic_affinity
        if aff is not None:
            if len(aff) != self.gpus_per_node:
                raise ValueError(f"network.nic_affinity needs {self.gpus_per_node} entries, got {len(aff)}")
            if any(not 0 <= a < self.network.nics_per_node for a in aff):
                raise ValueError(f"network.nic_affinity entries must lie in 0..{self.network.nics_per_node - 1}")
        return self

    @model_validator(mode="after")
    def _efficiency_on_device(self):
        """The efficiency figures that name the accelerator's dtypes or units (Efficiency alone does not see it)."""
        # per-dtype tables: a misspelt key (bfloat16) would silently drop its figure
        dtypes = {"bf16", "fp16", "fp32", "fp8"} | set(self.accelerator.peak_tflops)
        for name, keys in (("gemm_overhead_us", dtypes), ("gemm_dtype", dtypes | {"mxfp8", "fp8_blockwise"})):
            unknown = set(getattr(self.efficiency, name)) - keys
            if unknown:
                raise ValueError(f"efficiency.{name} keys must be among {', '.join(sorted(keys))}; not {sorted(unknown)}")
        if self.efficiency.overlap_comm_units > self.accelerator.compute_units:
            raise ValueError(f"efficiency.overlap_comm_units ({self.efficiency.overlap_comm_units}) exceeds the "
                             f"device's compute_units ({self.accelerator.compute_units})")
        return self

    def _job_blocks(self) -> list[int]:
        """Each level's job_block given or derived (Level.job_block), checked: a job holds whole
        nodes and the top level the whole job, so only the levels between may set one; a block is
        whole blocks of the level below, no more than a domain's share of them."""
        out, top = [], len(self.topology) - 1
        for i, lv in enumerate(self.topology):
            if lv.job_block is not None and (lv.size <= self.gpus_per_node or i == top):
                where = "the top level holds the whole job" if i == top else "a job holds whole nodes"
                raise ValueError(f"level {lv.name!r}: job_block applies to levels above the node and below the top "
                                 f"({where})")
            # as many ranks as this domain's domains of the level below hold (their blocks, not their GPUs)
            most = lv.size if i in (0, top) else lv.size // self.topology[i - 1].size * out[-1]
            block = most if lv.job_block is None else lv.job_block
            if i and i < top and (block > most or block % out[-1]):
                raise ValueError(f"level {lv.name!r}: job_block={block} must be a multiple of the level below's "
                                 f"{out[-1]} and at most the {most} its domains of that level hold")
            out.append(block)
        return out

    @property
    def job_blocks(self) -> list[int]:
        """Ranks of one job that a domain of each level holds, in rank order (Level.job_block):
        the domain size that group containment (cost/comm.py level_counts) reads."""
        return self._job_blocks()

    # ---- derived figures -----------------------------------------------------------
    def require_peaks(self, dtypes, source: str | None = None) -> None:
        """A one-line SpecError naming `source` (the spec's file; default its name) where the
        spec has no peak for one of `dtypes`, the math a layout runs: never another dtype's rate
        (fp32 GEMMs priced at the bf16 peak would be 15x fast on an H100)."""
        peaks = self.accelerator.peak_tflops
        for d in dtypes:
            if d not in peaks:
                raise SpecError(source or f"hardware {self.name}", "accelerator.peak_tflops",
                                f"expected an entry for {d} (the layout runs {d} math); it has {', '.join(sorted(peaks))}")

    def require_attention(self, kernel: str, source: str | None = None) -> None:
        """A one-line SpecError naming `source` (default the spec's name) where the spec states no
        plateau for the fused attention kernel a layout runs (Layout.attention_kernel): fa2
        priced at another kernel's plateau would be 1.5x fast on an H100."""
        if kernel == "fa2" and self.efficiency.attention_fa2 is None:
            raise SpecError(source or f"hardware {self.name}", "efficiency.attention_fa2",
                            "expected FlashAttention-2's plateaus (forward, backward) on this accelerator for "
                            "attention fa2; it states only its fused kernel's (attention flash)")

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak, FLOP/s (require_peaks: the CLI checks first, naming the file)."""
        self.require_peaks((dtype,))
        return self.accelerator.peak_tflops[dtype] * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.accelerator.memory_gib * 2**30

    @property
    def nic_gbps_per_gpu(self) -> float:
        """Injection bandwidth a GPU gets from the node's NICs when all GPUs send, GB/s: its NIC's
        rate over the GPUs that share it, on the busiest NIC (nic_of), which the slowest rank of a
        collective or exchange waits on; with GPUs spread evenly, nics x nic_gbps / GPUs."""
        aff, nics, gpn = self.network.nic_affinity, self.network.nics_per_node, self.gpus_per_node
        if aff is not None:
            shared = max(aff.count(n) for n in set(aff))
        else:  # nic_of's blocks: `per` GPUs a NIC, the last NIC taking what is left
            per = max(1, gpn // nics)
            shared = max(per, gpn - per * (nics - 1))
        return self.network.nic_gbps / shared

    def level_bandwidth_gbps(self, i: int) -> float:
        lv = self.topology[i]
        return lv.bandwidth_gbps if not lv.via_nic else self.nic_gbps_per_gpu * lv.taper

    @property
    def node_level(self) -> int:
        return [lv.size for lv in self.topology].index(self.gpus_per_node)

    @property
    def scaleup_level(self) -> int:
        """Largest level reached without the NICs: the node, or a scale-up fabric such as
        NVL72 that spans nodes. Traffic above it goes through the NICs."""
        return max(i for i, lv in enumerate(self.topology) if not lv.via_nic)

    def nic_of(self, local: int) -> int:
        aff = self.network.nic_affinity
        if aff is not None:
            return aff[local]
        per = max(1, self.gpus_per_node // self.network.nics_per_node)
        return min(local // per, self.network.nics_per_node - 1)
