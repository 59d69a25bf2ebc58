"""Demo: `gpufinops demo`. `run` replays the bundled GenTD26 trace on a simulated clock through the real
pipeline; `sim` is the simulated clock, EC2 and metrics behind the same interfaces (also used by tests).

May import: anything below cli. Nothing but cli imports it.
"""
