"""Local autostop for `gpufinops agent --autostop RULES`: a rented GPU server that stops itself when idle.

No cloud API to read usage and no central service: the agent's own nvidia-smi samples go into a SQLite ring
buffer on the host (`buffer`), the same pure `decide.evaluate` judges the host under the same rule files the
service reads, and a small state machine (`machine`) warns the people on the machine (`wall`, Slack when
configured), waits the rule's full warning lead, runs a pre-stop hook (`hook`) and stops the host
(`stopper`: EC2 StopInstances on its own id via IMDSv2, else a configured command such as systemctl poweroff).
Logged-in users with recent input, allow-listed processes, a GPU that cannot be read and a snooze file
(`guards`, `snooze`) block a stop. Dry-run unless --autostop-live (or `live: true` in the settings file).

Owns: gpufinops/autostop/*. May import: model, config, rules, decide, messages, notify, store (for the Slack
notifier's delivery records only), collect.gpu_snapshot. Nothing outside cli/ imports it.
"""
