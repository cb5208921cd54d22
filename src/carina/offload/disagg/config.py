"""Configuration of a disaggregated data-parallel job."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from carina.core.config import Config, require
from carina.offload.config import OffloadConfig

__all__ = ["DisaggConfig", "PSKernel", "PublishDtype", "WorkerRuntime"]


class PublishDtype(enum.Enum):
    """Precision of the parameters the PS publishes to workers."""

    FLOAT32 = "float32"  # exact (CPU workers, tests)
    BFLOAT16 = "bfloat16"  # half the H2D bytes (GPU workers computing in bf16)


class PSKernel(enum.Enum):
    """Which CPU kernel a PS shard's optimizer runs."""

    AUTO = "auto"  # fused when the workers compute on CUDA, else single-tensor
    SINGLE = "single"  # torch's single-tensor loop (foreach=False)
    FUSED = "fused"  # torch's fused CPU kernel (one pass over each parameter)


class WorkerRuntime(enum.Enum):
    """What trains inside a worker process."""

    OFFLOAD = "offload"  # carina.offload's block runtime, the PS as its gradient/optimizer backend
    PLAIN = "plain"  # the model as it is, parameters resident (any nn.Module, no repeated blocks needed)


@dataclass(kw_only=True)
class DisaggConfig(Config):
    """One host's workers and parameter-server shards.

    Attributes:
        workers: Worker processes on this host (one per GPU; CPU processes in tests).
        ps_shards: Parameter-server processes; parameters are split among them by size.
        publish_dtype: Precision of published parameters.
        device: ``auto``, ``cuda`` or ``cpu`` for the workers' compute.
        shm_dir: Where the shared segments live (a tmpfs such as /dev/shm).
        step_timeout_s: How long a side waits for the other before failing the step.
        optimizer: ``adamw`` or ``sgd`` (run by each PS shard on fp32 masters).
        lr: Learning rate.
        weight_decay: Decoupled weight decay (AdamW).
        hosts: Hosts in the job (>1 makes PS shards all-reduce across hosts with gloo).
        host_rank: This host's rank among ``hosts``.
        master_addr: Rendezvous address of the cross-host PS groups.
        master_port: Rendezvous port.
        runtime: What trains in a worker (:class:`WorkerRuntime`).
        offload: The block runtime's config for ``runtime=offload`` (its ``device`` is replaced by
            the worker's); no clipping (it needs the global norm) and one backward per step.
        ps_threads: CPU threads of each PS shard's optimizer.
        ps_kernel: The shards' optimizer kernel (:class:`PSKernel`).
        worker_threads: CPU threads of each worker process.
        checkpoint_every: With a checkpoint callback: PS shards pause before applying step k
            while k is a multiple of this, until the callback took the state of step k (0: never).
    """

    workers: int = 1
    ps_shards: int = 1
    publish_dtype: PublishDtype = PublishDtype.FLOAT32
    device: str = "auto"
    shm_dir: Path = Path("/dev/shm")
    step_timeout_s: float = 300.0
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    hosts: int = 1
    host_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29650
    runtime: WorkerRuntime = WorkerRuntime.OFFLOAD
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    ps_threads: int = 1
    ps_kernel: PSKernel = PSKernel.AUTO
    worker_threads: int = 1
    checkpoint_every: int = 0

    def validate(self) -> None:
        """Positive counts, a known optimizer and device, a host rank inside the host count."""
        require(self.workers >= 1, "need at least one worker", key="workers")
        require(self.ps_shards >= 1, "need at least one PS shard", key="ps_shards")
        require(self.optimizer in ("adamw", "sgd"), "optimizer is adamw or sgd", key="optimizer")
        require(self.device in ("auto", "cuda", "cpu"), "device is auto, cuda or cpu", key="device")
        require(self.step_timeout_s > 0, "step_timeout_s must be positive", key="step_timeout_s")
        require(self.hosts >= 1 and 0 <= self.host_rank < self.hosts, "host_rank must be < hosts", key="host_rank")
        require(self.ps_threads >= 1, "ps_threads must be >= 1", key="ps_threads")
        require(self.worker_threads >= 1, "worker_threads must be >= 1", key="worker_threads")
        require(self.checkpoint_every >= 0, "checkpoint_every must be >= 0", key="checkpoint_every")
        require(
            self.offload.max_grad_norm is None,
            "clipping needs the global gradient norm, which no worker has; the PS does not clip yet",
            key="offload.max_grad_norm",
        )
        require(
            self.offload.grad_accumulation == 1,
            "a disagg worker runs one backward per step (more workers = a larger batch)",
            key="offload.grad_accumulation",
        )
