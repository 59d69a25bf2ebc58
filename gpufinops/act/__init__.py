"""Act: the one chokepoint through which gpufinops changes anything in a cloud or a cluster.

The rule: every change of the world goes through `Actuator.change` (dry-run, the scheduler lease, the stop cap,
the intent written before the call, read back after it): the act stage's marks, stops, snoozes and tags, and
`restore` (a scale-down, a Kueue suspension or a cordon undone). A place's mutating methods (places/: tag, stop,
terminate, scale, suspend, cordon, restore) are called inside it and nowhere else. The agent's local stop
(agent/autostop, its own host only, with its own intent rows) is the one other door.

Owns: `plan` (pure: instance, its primary decision, its mark, its stored state, now -> Intent; table-tested),
`actuator` (`Actuator.apply()` carries intents out through `Actuator.change()`), `lease` (the scheduler lease and
its fencing token, checked before every change), `restore` (`gpufinops k8s restore`).
May import: model, config, rules, store, notify, places (the clouds it acts through), prices, words (a power-off's
billing sentence). Never imports run, cost, report, recommend, backtest, demo, agent or cli. `plan` imports model,
config, words and places.registry (pure) only.
"""
