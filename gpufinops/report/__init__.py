"""The monthly GPU FinOps audit report: HTML with charts, one CSV per table, JSON."""

from .monthly import monthly_audit, write_monthly_report

__all__ = ["monthly_audit", "write_monthly_report"]
