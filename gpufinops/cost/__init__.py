"""Cost: accounting above the store. `costs` (idle cost and spend over the stored verdicts and billing rows),
`budgets` (budget status, alerts and escalation; a Slurm account's budget too), `slurm` (Slurm GPU-hours and
dollars grouped, and their idle part from the stored `slurm:` verdicts), `escalations` (the stored budget
escalations: written by the budget job, read by the tick; the pure promotion is decide.escalation).

May import: model, config, rules, store, collect (billing), prices, decide, notify.
Never imports act, run, report, recommend, backtest, demo, agent or cli.
"""
