"""Typed configuration of the provisioning service and its enums."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

from carina.core.config import Config, require

__all__ = ["ExportKind", "IscsiBacking", "NodeState", "ProvisionConfig", "check_name"]

_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,47}")


def check_name(value: str, *, key: str) -> str:
    """Return ``value`` if it is a safe resource name (image, node, project), else ConfigError."""
    require(
        isinstance(value, str) and _NAME.fullmatch(value) is not None,
        f"{value!r} is not a valid name: 1-48 of [a-z0-9.-], starting with a letter or digit",
        key=key,
    )
    return value


class ExportKind(enum.Enum):
    """How a node's disk leaves the storage host."""

    NBD = "nbd"  # qemu-storage-daemon NBD server, driven over QMP
    ISCSI = "iscsi"  # userspace tgtd target


class IscsiBacking(enum.Enum):
    """What tgtd serves for an iSCSI export (tgt cannot read qcow2 itself)."""

    AUTO = "auto"  # FUSE when /dev/fuse exists, else a raw copy
    FUSE = "fuse"  # qemu-storage-daemon exposes the qcow2 clone as a raw file: copy-on-write kept
    RAW_COPY = "raw_copy"  # flatten the clone to a raw file: a full copy, no FUSE needed


class NodeState(enum.Enum):
    """Life cycle of a node's network disk."""

    FREE = "free"  # no disk
    PROVISIONED = "provisioned"  # clone + export + boot script in place
    RETAINED = "retained"  # released but its disk was kept (a failed server's disk outlives it)


@dataclass(kw_only=True)
class ProvisionConfig(Config):
    """Where the service keeps its state and how it serves disks.

    Attributes:
        state_dir: Images, clones, daemon sockets, consoles and (by default) the database.
        database_url: SQLAlchemy URL; empty means ``sqlite:///<state_dir>/provision.db``.
        listen_host: Address the NBD, iSCSI and HTTP servers bind (and that boot scripts name).
        nbd_port: qemu-storage-daemon NBD server port.
        iscsi_port: tgtd portal port.
        tgt_control_port: tgtd management channel number, 1..32767 (one tgtd per state
            dir); 0 derives it from ``iscsi_port``.
        http_port: Port of the REST API and of ``/boot/<mac>.ipxe``.
        iscsi_backing: See :class:`IscsiBacking`.
        link_rate_bps: Throttle every export to this many bytes/s in total (0 = off); used
            to model a network link in benchmarks.
        iqn_prefix: Prefix of iSCSI target names.
        advertise_host: Address nodes use to reach the NBD/iSCSI servers in boot scripts
            (default: ``listen_host``).
        boot_url: Base URL nodes use to reach the HTTP server (default:
            ``http://<advertise_host>:<http_port>``).
        kernel_cmdline: Extra kernel arguments in NBD boot scripts.
    """

    state_dir: Path = Path("carina-provision")
    database_url: str = ""
    listen_host: str = "127.0.0.1"
    nbd_port: int = 10809
    iscsi_port: int = 3260
    tgt_control_port: int = 0
    http_port: int = 8470
    iscsi_backing: IscsiBacking = IscsiBacking.AUTO
    link_rate_bps: int = 0
    iqn_prefix: str = "iqn.2026-11.io.carina"
    advertise_host: str = ""
    boot_url: str = ""
    kernel_cmdline: str = "console=ttyS0"

    def validate(self) -> None:
        """Check ports, rates and the IQN prefix."""
        for key in ("nbd_port", "iscsi_port", "http_port"):
            port = getattr(self, key)
            require(0 < port < 65536, f"{key} must be in 1..65535, got {port}", key=key)
        require(0 <= self.tgt_control_port < 32768, "tgt_control_port must be 0..32767", key="tgt_control_port")
        require(self.link_rate_bps >= 0, "link_rate_bps must be >= 0", key="link_rate_bps")
        require(
            re.fullmatch(r"iqn\.\d{4}-\d{2}\.[a-z0-9.-]+", self.iqn_prefix) is not None,
            f"iqn_prefix {self.iqn_prefix!r} is not iqn.YYYY-MM.reversed.domain",
            key="iqn_prefix",
        )
        require(bool(self.listen_host), "listen_host must not be empty", key="listen_host")

    @property
    def node_host(self) -> str:
        """The storage host as nodes see it."""
        return self.advertise_host or self.listen_host

    @property
    def node_boot_url(self) -> str:
        """The HTTP base URL as nodes see it."""
        return (self.boot_url or f"http://{self.node_host}:{self.http_port}").rstrip("/")

    @property
    def db_url(self) -> str:
        """The effective database URL."""
        return self.database_url or f"sqlite:///{self.state_dir.resolve() / 'provision.db'}"

    def path(self, *parts: str) -> Path:
        """A path inside the state directory (created on demand by its users)."""
        return self.state_dir.resolve().joinpath(*parts)
