"""Run: the service. `pipeline` (one tick: collect -> decide -> act -> notify/store), `service` (APScheduler,
/metrics, /livez, /readyz, SIGTERM), `jobs` (the scheduled jobs beside the tick), `httpd` (the HTTP endpoints),
`compose` (the composition root: the one place that turns settings into the live peers).

May import: everything below it (collect, places, decide, act, notify, store, cost, recommend, report, prices).
Never imports demo, agent or cli; nothing below imports it.
"""
