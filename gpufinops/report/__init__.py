"""Report: the monthly GPU FinOps audit report, HTML with charts, one CSV per table, JSON.

Reads what the service stored (decisions, actions, costs, budgets) and renders it; changes nothing but the
notification rows of its own deliveries. May import:
model, config, store, costs, cost.slurm (the Slurm sums, handed their usage by the caller), collect.billing,
budgets (read and evaluated, never changed), act.plan (pure: the
advice uses its policy functions),
places.kubernetes.names' and .nodes' id parsers (pure), and for delivery (deliver.py) notify's markup escape and
store.schema's `mailto:` channel prefix (the report's notification rows are read to send each once). Templates autoescape:
tag values are untrusted.
"""

from .monthly import monthly_audit, write_monthly_report

__all__ = ["monthly_audit", "write_monthly_report"]
