"""Configuration of a disaggregated data-parallel job."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from carina.core.config import Config, require

__all__ = ["DisaggConfig", "PublishDtype"]


class PublishDtype(enum.Enum):
    """Precision of the parameters the PS publishes to workers."""

    FLOAT32 = "float32"  # exact (CPU workers, tests)
    BFLOAT16 = "bfloat16"  # half the H2D bytes (GPU workers computing in bf16)


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

    def validate(self) -> None:
        """Positive counts, a known optimizer and device, a host rank inside the host count."""
        require(self.workers >= 1, "need at least one worker", key="workers")
        require(self.ps_shards >= 1, "need at least one PS shard", key="ps_shards")
        require(self.optimizer in ("adamw", "sgd"), "optimizer is adamw or sgd", key="optimizer")
        require(self.device in ("auto", "cuda", "cpu"), "device is auto, cuda or cpu", key="device")
        require(self.step_timeout_s > 0, "step_timeout_s must be positive", key="step_timeout_s")
        require(self.hosts >= 1 and 0 <= self.host_rank < self.hosts, "host_rank must be < hosts", key="host_rank")
