"""Provisioning errors a caller can act on distinctly (both are ProvisioningError)."""

from __future__ import annotations

from carina.core.errors import ProvisioningError

__all__ = ["Conflict", "NotFound"]


class NotFound(ProvisioningError):
    """A project, image, node or MAC the request names does not exist (for the caller)."""


class Conflict(ProvisioningError):
    """The request contradicts the current state (name taken, image in use, node busy)."""
