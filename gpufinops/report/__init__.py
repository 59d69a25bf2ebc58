"""Report: the monthly GPU FinOps audit report, HTML with charts, one CSV per table, JSON.

Reads what the service stored (decisions, actions, costs, budgets) and renders it; changes nothing. May import:
model, config, store, costs, collect.billing, budgets (read and evaluated, never changed), act.plan (pure: the
advice uses its policy functions), and
places.kubernetes.cloud's workload-id parsers (pure). Templates autoescape:
tag values are untrusted.
"""

from .monthly import monthly_audit, write_monthly_report

__all__ = ["monthly_audit", "write_monthly_report"]
