"""Run: the service. `pipeline` (one tick: collect -> decide -> act -> notify/store), `service` (APScheduler,
/metrics, /livez, /readyz, SIGTERM, served by the root's `httpd`), `api` (the /v1/verdicts routes), `jobs` (the
scheduled jobs beside the tick), `compose` (the composition root: the one place that turns settings into the live
peers), `slurm_cost` (the Slurm clusters' month from sacct, priced, with its idle join: for `costs`, the budget
check and the report).

May import: everything below it (collect, places, decide, act, notify, store, cost, recommend, report, prices) and
the root modules (model, config, rules, words, httpd, ...).
Never imports demo, agent or cli; nothing below imports it.
"""
