"""Act: the one chokepoint through which gpufinops changes anything in a cloud or a cluster.

Owns: `plan` (pure: instance, its primary decision, its mark, its stored state, now -> Intent; table-tested),
`actuator` (`Actuator.apply()` carries intents out; every cloud mutation goes through `Actuator._change()`:
dry-run, the stop cap, intent written before the call, read back after it), `lease` (the scheduler lease and
its fencing token, checked before every change), `restore` (`gpufinops k8s restore`).
May import: model, config, rules, store, notify, places (the clouds it acts through), prices.
Never imports run, cost, report, recommend, backtest, demo, agent or cli. `plan` imports model, config and
places.registry (pure) only.
"""
