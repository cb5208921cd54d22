"""Public face of carina's exception tree; see :mod:`carina.core.errors`."""

from carina.core.errors import (
    AlignmentError,
    BackendUnavailable,
    CapacityError,
    CarinaError,
    CheckpointError,
    ConfigError,
    CorruptCheckpoint,
    DeviceFull,
    IOEngineError,
    ModelFormatError,
    ProvisioningError,
    ShortRead,
    StorageProtocolError,
    ValidationFailed,
)

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
