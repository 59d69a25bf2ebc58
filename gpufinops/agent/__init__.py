"""Agent: the host side. `exporter` serves a host's GPU metrics (NVML, nvidia-smi) for Prometheus;
`autostop/` stops its own host with the same rules and the same `decide.evaluate` (docs/agent.md).

May import: model, config, rules, decide, collect, places.ec2 (the EC2 self-stop), places.gcp (the GCE self-stop),
places.azure (the Azure self-deallocate), prices, procs, metric_ranges, httpd (the same HTTP endpoint and bearer check
as the service's, from the ground floor), and act.plan (pure: the one snooze parser and cap). Never imports act's
actuator, run, cost, report or cli (autostop's Slack notifier uses notify and its delivery records store, as before);
nothing below imports it (cli/agent.py sits above)."""
