"""When a stop pays: the break-even figures the backtest, the demo and the monthly report count net savings with.
A leaf, no imports: the settings (config.capabilities, the report's false_stop_s default) read them without loading
model's types, which `gpufinops costs` never needs (a few ms of its start, BENCHMARKS.md). model hands them on under
the same names.
"""

# A stop undone within this long (demand back, instance restarted) is a false stop: it cost more than
# it saved, the break-even of a stop. The backtest, the demo and the monthly report
# count false stops against this one figure; their settings default to it.
FALSE_STOP_WITHIN_S = 1800
# What a false stop costs a person on top of the restart (lost work, a wait, a ticket), in GPU-hours: the c of
# every policy score, net GPU-h - c x false stops (backtest --false-stop-cost, the demo's summary).
FALSE_STOP_COST_H = 2.0
# Paid, unproductive time of a restart (boot, model load, warm-up), in seconds: the backtest's restart_cost_s
# default, the demo's and the monthly report's, so that all three count net savings alike.
RESTART_COST_S = 600.0
