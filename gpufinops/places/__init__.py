"""Places: where GPUs live, each behind the `Cloud` protocol (model.Cloud: list, describe, and the only clients that
change anything: tag, stop, terminate, scale to zero, suspend, cordon, restore).

Owns: `ec2/` (AWS EC2: the inventory and its stop client, several accounts), `gcp/` (Compute Engine GPU VMs: labels
as tags, the stop; WithGce beside the others), `azure/` (Azure VMs of GPU sizes across subscriptions through ARM: tags
with the Tags API, the stop a deallocate; a power-off only for a rule's `action: power_off`), `hosts` (rented hosts
listed in the config: read-only, each stopped from the host itself by `gpufinops agent --autostop`), `kubernetes/`
(the cluster reader, per-pod GPU usage, a node's cost split over its pods, workloads and nodes as a Cloud), and
`fleet`: the one Cloud over every place (`RoutedCloud` routes a change to the one place that listed the subject,
and never guesses; `FleetCloud`/`FleetMetrics` put EC2 and the cluster side by side, `WithRentedHosts` a cloud and
the rented hosts; `merge_listings` is their one listing merge, used by ec2.accounts too: a part that cannot be
listed makes the listing partial, never empty), and `registry`: what each place can do (its id prefix, the actions
it takes, why it refuses the others, its words in a message), asked by act.plan, rules.py, notify.messages and
report/ instead of tables of their own; it imports model's leaves (rule_types, subject_ids) and k8s.tags only (pure:
the host agent imports act.plan).
run/compose.py builds the clouds; their mutating methods are called by act/ alone (the Actuator, `k8s restore`), and
by the agent's autostop for its own EC2 host (`ec2.cloud.Ec2Cloud`), GCE VM (`gcp.cloud.GceCloud`) or Azure VM
(`azure.cloud.AzureCloud`).

May import: model (and its leaves rule_types, subject_ids), config, k8s.model, prices, collect (errors, aws_config,
prometheus: the readers a place reads through), decide.workloads (a workload's usage over its pods, a node's drain refusal: the same verdict rules).
Never imports rules, act, notify, store, cost, report, recommend, backtest, run, demo, agent or cli.
"""
