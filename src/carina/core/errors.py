"""The one exception tree of carina.

Every error carina raises on purpose is a :class:`CarinaError`. Each carries the
context that locates the problem (a path, an offset, a config key, a file:line),
so a message says *what* went wrong and *where*::

    CarinaError
    ├── ConfigError (ValueError)       a config or argument is invalid (key=...)
    ├── BackendUnavailable             a backend/plugin cannot run here (names the fix)
    ├── IOEngineError                  storage IO failed (path=..., offset=...)
    │   ├── ShortRead                  fewer bytes than requested came back
    │   ├── AlignmentError             O_DIRECT buffer/offset/length not aligned
    │   └── DeviceFull                 no space left on the target device
    ├── CapacityError                  a plan cannot fit its budgets (said before work starts)
    ├── CheckpointError                a checkpoint cannot be written or restored
    │   └── CorruptCheckpoint          checksum/manifest mismatch; never selected
    ├── ProvisioningError              images, clones, exports, boots
    ├── StorageProtocolError           a peer broke a wire protocol (NBD, iSCSI)
    ├── ModelFormatError (ValueError)  bad outside input: YAML models, images (file:line)
    └── ValidationFailed               a node/link validation check failed

Rules: raise the most specific class; ``assert`` is for internal invariants only;
backends translate foreign exceptions at their boundary (``raise X(...) from exc``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlignmentError",
    "BackendUnavailable",
    "CapacityError",
    "CarinaError",
    "CheckpointError",
    "ConfigError",
    "CorruptCheckpoint",
    "DeviceFull",
    "IOEngineError",
    "ModelFormatError",
    "ProvisioningError",
    "ShortRead",
    "StorageProtocolError",
    "ValidationFailed",
]


class CarinaError(Exception):
    """Root of every error carina raises on purpose.

    Args:
        message: What went wrong, in words a user can act on.
        **context: Where it went wrong (``path=``, ``offset=``, ``key=``, ...).
            Kept in :attr:`context` and appended to ``str(error)``.
    """

    def __init__(self, message: str, **context: Any) -> None:
        self.message = message
        self.context: dict[str, Any] = {k: v for k, v in context.items() if v is not None}
        super().__init__(message)

    def __str__(self) -> str:
        if not self.context:
            return self.message
        where = ", ".join(f"{k}={v!r}" for k, v in self.context.items())
        return f"{self.message} ({where})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep context across pickling (worker processes raise these too).
        return (_rebuild, (type(self), self.message, self.context))


def _rebuild(cls: type[CarinaError], message: str, context: dict[str, Any]) -> CarinaError:
    return cls(message, **context)


class ConfigError(CarinaError, ValueError):
    """A config value or argument is invalid; ``key`` names it."""


class BackendUnavailable(CarinaError):
    """A backend or plugin cannot be used here; the message names the fix."""


class IOEngineError(CarinaError):
    """A storage read or write failed."""


class ShortRead(IOEngineError):
    """Fewer bytes came back than were asked for (``expected``, ``got``)."""


class AlignmentError(IOEngineError):
    """An O_DIRECT request is not aligned to the device's block size."""


class DeviceFull(IOEngineError):
    """The target device has no space left."""


class CapacityError(CarinaError):
    """A plan cannot fit its memory/disk budgets; raised before any work starts."""


class CheckpointError(CarinaError):
    """A checkpoint could not be written, committed or restored."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint failed verification; it is never selected for restore."""


class ProvisioningError(CarinaError):
    """Provisioning (images, clones, exports, network boot) failed."""


class StorageProtocolError(CarinaError):
    """A peer sent something a wire protocol does not allow."""


class ModelFormatError(CarinaError, ValueError):
    """Outside input (a YAML model, a disk image, a manifest) is malformed.

    Pass ``file=`` and ``line=`` so the message points at the input.
    """


class ValidationFailed(CarinaError):
    """A node or link validation check failed its threshold."""
