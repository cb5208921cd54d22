"""Node validation checks: the registry, the result types and the grading rules."""

from carina.infra.cluster.checks.base import (
    CHECKS,
    Check,
    CheckContext,
    CheckResult,
    Status,
    Threshold,
    fleet_outliers,
)

__all__ = ["CHECKS", "Check", "CheckContext", "CheckResult", "Status", "Threshold", "fleet_outliers"]
