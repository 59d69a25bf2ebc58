"""Memory needed by a declared workload, and the cheapest configurations that hold it.

The formulas (stated with their assumptions in docs/recommend.md):

    weights     = P x bytes(precision)
    gradients   = P x grad_bytes            (training modes only)
    optimizer   = P x optim_bytes           (Adam: two fp32 moments = 8 bytes/param;
                                             pretrain adds an fp32 master copy = 12)
    activations = L x b x s x d x 2 bytes x act_factor   (training, with checkpointing)
    kv_cache    = 2 x L x d x kv_ratio x s x b x kv_bytes (inference)
    total       = (sum) x (1 + overhead)

Model shape, when not given, follows the dense-decoder rule P ~= 12 L d^2 with
d ~= 100 L (Llama-class aspect ratio): d = (100 P / 12)^(1/3), L = d / 100.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from gpufinops.prices.catalog import Catalog, InstanceOffer

GB = 1e9  # sizes are decimal GB, as the field quotes them ("70B needs 840 GB")


class Mode(str, enum.Enum):
    INFERENCE = "inference"
    PEFT = "peft"
    FULL_FINETUNE = "full-finetune"
    PRETRAIN = "pretrain"


BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


class SizingError(ValueError):
    pass


@dataclass(frozen=True)
class SizingAssumptions:
    """Every rule of thumb the estimate uses; each is a knob, none a constant in code."""

    adam_state_bytes: float = 8.0  # two fp32 moments per trained parameter
    master_weights_bytes_pretrain: float = 4.0  # fp32 master copy (ZeRO's 16 bytes/param recipe)
    peft_trainable_fraction: float = 0.01  # LoRA adapters: ~0.1-1% of parameters
    peft_trainable_bytes: float = 16.0  # adapter weights+grads+master+Adam, fp32/bf16 mix
    activation_factor: float = 2.0  # per-layer checkpoint + recompute working set, in units of b*s*d*2 bytes
    kv_heads_ratio: float = 0.125  # grouped-query attention (8 KV heads of 64)
    overhead: float = 0.10  # CUDA context, allocator fragmentation, buffers
    usable_memory_fraction: float = 0.90  # of a GPU's nominal memory a job can fill


@dataclass(frozen=True)
class MemoryEstimate:
    params: float
    mode: Mode
    precision: str
    context: int
    batch: int
    layers: int
    hidden: int
    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float  # training activations, or the KV cache for inference
    overhead_gb: float

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.gradients_gb + self.optimizer_gb + self.activations_gb + self.overhead_gb

    @property
    def states_gb(self) -> float:
        """Weights + gradients + optimizer states: the figure the 840 GB rule quotes."""
        return self.weights_gb + self.gradients_gb + self.optimizer_gb

    def to_dict(self) -> dict:
        return {
            "params": self.params, "mode": self.mode.value, "precision": self.precision,
            "context": self.context, "batch": self.batch, "layers": self.layers, "hidden": self.hidden,
            "weights_gb": round(self.weights_gb, 2), "gradients_gb": round(self.gradients_gb, 2),
            "optimizer_gb": round(self.optimizer_gb, 2),
            ("kv_cache_gb" if self.mode is Mode.INFERENCE else "activations_gb"): round(self.activations_gb, 2),
            "overhead_gb": round(self.overhead_gb, 2), "total_gb": round(self.total_gb, 2),
        }


def model_shape(params: float) -> tuple[int, int]:
    """(layers, hidden) of a dense decoder with `params` parameters."""
    hidden = (100.0 * params / 12.0) ** (1.0 / 3.0)
    layers = max(1, round(hidden / 100.0))
    hidden = int(round(math.sqrt(params / (12.0 * layers))))
    return layers, hidden


def estimate_memory(
    params: float,
    mode: Mode | str,
    precision: str,
    context: int = 4096,
    batch: int = 1,
    layers: int | None = None,
    hidden: int | None = None,
    a: SizingAssumptions = SizingAssumptions(),
) -> MemoryEstimate:
    mode = Mode(mode)
    if precision not in BYTES:
        raise SizingError(f"precision must be one of {', '.join(BYTES)}, got {precision!r}")
    if params <= 0 or context < 1 or batch < 1:
        raise SizingError("params, context and batch must be positive")
    if mode in (Mode.FULL_FINETUNE, Mode.PRETRAIN) and precision in ("int8", "int4"):
        raise SizingError(f"{mode.value} cannot train {precision} weights; use --mode peft (QLoRA) or bf16/fp8")
    if layers is None or hidden is None:
        est_layers, est_hidden = model_shape(params)
        layers, hidden = layers or est_layers, hidden or est_hidden
    w = BYTES[precision]
    weights = params * w
    grads = optim = acts = 0.0
    if mode is Mode.INFERENCE:
        kv_bytes = 1.0 if precision in ("fp8", "int8", "int4") else 2.0  # KV cache quantised along with weights
        acts = 2.0 * layers * hidden * a.kv_heads_ratio * context * batch * kv_bytes
    else:
        acts = layers * batch * context * hidden * 2.0 * a.activation_factor
        if mode is Mode.PEFT:
            optim = params * a.peft_trainable_fraction * a.peft_trainable_bytes
        else:
            # Gradients in the compute precision (bf16 for fp8 training: FP8 recipes keep bf16 grads).
            grads = params * max(w, 2.0)
            optim = params * a.adam_state_bytes
            if mode is Mode.PRETRAIN:
                optim += params * a.master_weights_bytes_pretrain
    overhead = (weights + grads + optim + acts) * a.overhead
    return MemoryEstimate(params, mode, precision, context, batch, layers, hidden,
                          weights / GB, grads / GB, optim / GB, acts / GB, overhead / GB)


@dataclass(frozen=True)
class SizedOption:
    offer: InstanceOffer
    gpus_needed: int  # GPUs the job needs (it may use fewer than the instance has)
    per_gpu_gb: float
    hourly: float
    note: str

    def to_dict(self) -> dict:
        o = self.offer
        return {
            "provider": o.provider, "instance_type": o.instance_type, "region": o.region, "gpu": o.gpu,
            "gpu_count": o.gpu_count, "gpus_needed": self.gpus_needed, "per_gpu_gb": round(self.per_gpu_gb, 1),
            "on_demand_usd_h": round(o.on_demand_usd_h, 4),
            "prices_as_of": o.prices_as_of.isoformat() if o.prices_as_of else None, "note": self.note,
        }


def fitting_options(
    est: MemoryEstimate,
    catalog: Catalog,
    providers: list[str] | None = None,
    limit: int = 10,
    a: SizingAssumptions = SizingAssumptions(),
) -> list[SizedOption]:
    """Cheapest instance types whose GPUs hold the estimate, one row per (provider, type).

    Multi-GPU offers assume the states shard evenly (FSDP/ZeRO-3 for training,
    tensor parallelism for inference). FP8 needs FP8 tensor cores.
    """
    best: dict[tuple[str, str], SizedOption] = {}
    for o in catalog.offers_for(providers):
        spec = catalog.gpus[o.gpu]
        if est.precision == "fp8" and spec.fp8_tflops is None:
            continue
        usable = o.gpu_memory_gb * a.usable_memory_fraction
        needed = math.ceil(est.total_gb / usable)
        if needed > o.gpu_count:
            continue
        note = "single GPU" if needed == 1 else f"{needed} GPUs, states sharded (FSDP/ZeRO-3 or tensor parallel)"
        opt = SizedOption(o, needed, est.total_gb / needed, o.on_demand_usd_h, note)
        key = (o.provider, o.instance_type)
        if key not in best or opt.hourly < best[key].hourly:
            best[key] = opt
    return sorted(best.values(), key=lambda s: (s.hourly, s.offer.provider, s.offer.instance_type))[:limit]
