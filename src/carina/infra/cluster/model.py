"""An analytical throughput model of transformer training on N GPUs (``carina cluster model``).

Following Narayanan et al. (SC'21, arXiv 2104.04473), one iteration of a GPT-style model
with ``l`` layers, hidden size ``h``, sequence ``s``, vocabulary ``V`` and global batch ``B``
costs, with activation recomputation,

    F = 96·B·s·l·h² · (1 + s/(6h) + V/(16·l·h))          floating-point operations
    P = 12·l·h² · (1 + 13/(12h) + (V + s)/(12·l·h))        parameters

On ``n = t·p·d`` GPUs (tensor, pipeline, data parallel) with ``m = B/(d·mb)`` micro-batches:

* compute: F / (n · peak · efficiency), stretched by the pipeline bubble (p−1)/m and by uneven
  stages (the slowest holds ⌈l/p⌉ layers);
* tensor parallel: 6 all-reduces per layer and micro-batch of mb·s·h·2 bytes, ring factor
  2(t−1)/t, over the intra-node link (NVLink);
* pipeline parallel: each stage sends and receives mb·s·h·2 bytes per micro-batch forward and
  backward over the GPU's share of the inter-node link;
* data parallel: a ring all-reduce of 2(d−1)/d · P/(t·p) · 2 bytes over that share, of which a
  fraction ``dp_overlap`` hides behind the backward pass.

The model reports TFLOP/s per GPU, MFU and the fraction of the throughput an infinitely fast
network would give; :func:`search` tries every layout that fits memory and returns the best.
It is validated against published points in the test suite (Vela ~80% at ~1500 A100s on a
50B model; Megatron-LM 52% of peak on 3072 A100s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from carina.core.config import Config, require
from carina.core.errors import CapacityError

__all__ = ["Cluster", "Layout", "ModelShape", "Prediction", "predict", "search"]


@dataclass(kw_only=True)
class ModelShape(Config):
    """A decoder-only transformer and its global batch (in sequences)."""

    layers: int
    hidden: int
    seq_len: int = 2048
    vocab: int = 51200
    global_batch: int = 1536

    def validate(self) -> None:
        """Every size is positive."""
        for key in ("layers", "hidden", "seq_len", "vocab", "global_batch"):
            require(getattr(self, key) > 0, f"{key} must be positive", key=key)

    def flops_per_iteration(self) -> float:
        """F, with activation recomputation (the 96 factor)."""
        n_l, h, s, v, b = self.layers, self.hidden, self.seq_len, self.vocab, self.global_batch
        return 96.0 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (16 * n_l * h))

    def parameters(self) -> float:
        """P."""
        n_l, h, s, v = self.layers, self.hidden, self.seq_len, self.vocab
        return 12.0 * n_l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * n_l * h))


@dataclass(kw_only=True)
class Cluster(Config):
    """The machines: GPUs, their rate and memory, and the links between them.

    Attributes:
        gpus: Total GPUs (n).
        gpus_per_node: GPUs sharing the intra-node link.
        peak_tflops: Dense bf16 peak per GPU.
        efficiency: Fraction of peak a GPU sustains on the model's matmuls (measure it with
            ``carina cluster check --checks matmul``).
        memory_gib: GPU memory.
        intra_gbps: Per-GPU intra-node bandwidth, GB/s per direction (NVLink).
        inter_gbit: Per-GPU share of inter-node bandwidth, Gbit/s.
        latency_us: Per-message latency of inter-node transfers.
        dp_overlap: Fraction of the data-parallel all-reduce hidden behind backward.
    """

    gpus: int
    gpus_per_node: int = 8
    peak_tflops: float = 312.0
    efficiency: float = 0.5
    memory_gib: float = 80.0
    intra_gbps: float = 300.0
    inter_gbit: float = 25.0
    latency_us: float = 10.0
    dp_overlap: float = 0.0

    def validate(self) -> None:
        """Counts positive, fractions in range."""
        require(self.gpus > 0 and self.gpus_per_node > 0, "gpus must be positive", key="gpus")
        require(0 < self.efficiency <= 1, "efficiency is a fraction of peak", key="efficiency")
        require(0 <= self.dp_overlap <= 1, "dp_overlap is a fraction", key="dp_overlap")
        require(self.inter_gbit > 0 and self.intra_gbps > 0, "bandwidths must be positive", key="inter_gbit")


@dataclass(kw_only=True)
class Layout(Config):
    """Parallel degrees: tensor (t), pipeline (p), data (d) and the micro-batch size."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    micro_batch: int = 1

    def validate(self) -> None:
        """Every degree is positive."""
        for key in ("tensor", "pipeline", "data", "micro_batch"):
            require(getattr(self, key) > 0, f"{key} must be positive", key=key)


@dataclass
class Prediction:
    """What the model expects of one layout."""

    layout: Layout
    step_s: float
    tflops_per_gpu: float
    mfu: float
    fraction_of_ideal: float  # vs an infinitely fast network
    breakdown_s: dict[str, float] = field(default_factory=dict)
    memory_gib: float = 0.0


def _check_layout(shape: ModelShape, cluster: Cluster, layout: Layout) -> int:
    """Micro-batches per pipeline, after checking the layout is consistent."""
    t, p, d, mb = layout.tensor, layout.pipeline, layout.data, layout.micro_batch
    if t * p * d != cluster.gpus:
        raise CapacityError(f"t·p·d = {t * p * d} but the cluster has {cluster.gpus} GPUs", key="layout")
    if t > cluster.gpus_per_node:
        raise CapacityError("tensor parallelism must stay inside a node", key="layout.tensor")
    if shape.global_batch % (d * mb):
        raise CapacityError(f"batch {shape.global_batch} does not split into d·mb = {d * mb}", key="layout")
    return shape.global_batch // (d * mb)


def memory_gib(shape: ModelShape, layout: Layout) -> float:
    """Per-GPU memory: 16 bytes per parameter shard (bf16 weights+grads, fp32 Adam) + checkpointed activations."""
    t, p, mb = layout.tensor, layout.pipeline, layout.micro_batch
    states = 16.0 * shape.parameters() / (t * p)
    # Recomputation keeps each layer's input (s·mb·h·2 bytes, sharded by t) for up to p micro-batches in flight.
    activations = 2.0 * shape.seq_len * mb * shape.hidden * (shape.layers / p) * p / t
    return (states + activations) / 2**30


def predict(shape: ModelShape, cluster: Cluster, layout: Layout) -> Prediction:
    """Expected step time and throughput of ``layout``.

    Raises:
        CapacityError: The layout does not match the cluster or the batch.
    """
    m = _check_layout(shape, cluster, layout)
    t, p, d, mb = layout.tensor, layout.pipeline, layout.data, layout.micro_batch
    flops = shape.flops_per_iteration()
    rate = cluster.peak_tflops * 1e12 * cluster.efficiency
    # Uneven stages: the slowest stage holds ceil(l/p) layers and sets the pace.
    imbalance = math.ceil(shape.layers / p) * p / shape.layers
    compute = flops / (cluster.gpus * rate) * imbalance
    bubble = compute * (p - 1) / m
    act_bytes = mb * shape.seq_len * shape.hidden * 2
    inter = cluster.inter_gbit * 1e9 / 8
    lat = cluster.latency_us * 1e-6
    tp = 0.0
    if t > 1:
        per_ar = 2 * (t - 1) / t * act_bytes / (cluster.intra_gbps * 1e9)
        tp = 6 * math.ceil(shape.layers / p) * m * per_ar
    pp = 2 * m * (act_bytes / t / inter + lat) * 2 if p > 1 else 0.0
    dp = 0.0
    if d > 1:
        dp_bytes = 2 * (d - 1) / d * shape.parameters() / (t * p) * 2
        dp = (dp_bytes / inter + 2 * (d - 1) * lat) * (1 - cluster.dp_overlap)
    step = compute + bubble + tp + pp + dp
    ideal = compute + bubble + tp  # what an infinitely fast inter-node network would leave
    tflops = flops / (cluster.gpus * step) / 1e12
    return Prediction(
        layout=layout,
        step_s=step,
        tflops_per_gpu=tflops,
        mfu=tflops / cluster.peak_tflops,
        fraction_of_ideal=ideal / step,
        breakdown_s={
            "compute": compute,
            "bubble": bubble,
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "data_parallel": dp,
        },
        memory_gib=memory_gib(shape, layout),
    )


def _divisors(n: int) -> list[int]:
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


def search(
    shape: ModelShape, cluster: Cluster, *, top: int = 5, micro_batches: tuple[int, ...] = (1, 2, 4)
) -> list[Prediction]:
    """The ``top`` fastest layouts that fit GPU memory.

    Raises:
        CapacityError: No layout fits (said before anything runs).
    """
    found: list[Prediction] = []
    for t in (x for x in _divisors(cluster.gpus_per_node) if cluster.gpus % x == 0):
        for p in (x for x in _divisors(cluster.gpus // t) if x <= shape.layers):
            d = cluster.gpus // (t * p)
            for mb in micro_batches:
                layout = Layout(tensor=t, pipeline=p, data=d, micro_batch=mb)
                try:
                    pred = predict(shape, cluster, layout)
                except CapacityError:
                    continue
                if pred.memory_gib <= 0.9 * cluster.memory_gib:
                    found.append(pred)
    if not found:
        raise CapacityError(
            f"no layout of {cluster.gpus} GPUs with {cluster.memory_gib} GiB fits a "
            f"{shape.parameters() / 1e9:.1f}B-parameter model",
            key="cluster",
        )
    return sorted(found, key=lambda pr: pr.step_s)[:top]
