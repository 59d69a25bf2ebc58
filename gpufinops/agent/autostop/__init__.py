"""Local autostop for `gpufinops agent --autostop RULES`: a rented GPU server that stops itself when idle.

No cloud API to read usage and no central service: the agent's own nvidia-smi samples go into a SQLite ring
buffer on the host (`buffer`), the same pure `decide.evaluate` judges the host under the same rule files the
service reads, and a small state machine (`machine`) warns the people on the machine (`wall`, Slack when
configured), waits the rule's full warning lead, runs a pre-stop hook (`hook`) and stops the host
(`stopper`: EC2 StopInstances on its own id via IMDSv2, else a configured command such as systemctl poweroff).
Logged-in users with recent input, allow-listed processes, a GPU that cannot be read and a snooze file
(`guards`, `snooze`) block a stop. Dry-run unless --autostop-live (or `dry_run: false` in the settings file, the service's name for the flag;
`live: true` is read as its deprecated alias, with a warning).

The snooze file's value is parsed and capped by the service's parser (`act.plan.snooze_value`); the EC2 self-stop is
the service's EC2 client (`places.ec2.cloud.Ec2Cloud`: one request, no retries, read back after an ambiguous error).
Owns: gpufinops/agent/autostop/*. May import: model, config, rules, decide, messages, notify, store (for the Slack
notifier's delivery records only), collect (gpu_snapshot), places.ec2.cloud, places.azure.cloud (an Azure VM
deallocates itself through ARM with its managed identity, never a guest shutdown), act.plan (pure). Nothing outside
cli/ imports it."""
