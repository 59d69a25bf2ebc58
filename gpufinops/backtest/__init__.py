"""Backtest: replay rules over past GPU history on a simulated clock and score them honestly.

Owns: traces (CSV/Parquet/Prometheus history), the vectorised replay (`engine`: mark, warning lead, stop, restart
on demand, false stops), the clairvoyant-with-lead ceiling and the net score, the rule sweep and `--tune` (a rule
picked on half the instances, scored on the other). Sits above `decide`: it imports the live predicates
(`decide.evaluate.window_is_idle`, `coverage_ok`) so that a replayed verdict is the live one (tests/
test_backtest_equivalence.py); nothing below imports it.
"""
