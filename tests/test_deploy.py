"""The shipped deploy/ files: promtool on the Prometheus files, IAM against the EC2 calls
the inventory really makes, Kubernetes manifests against each other and the config loader."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import subprocess
from pathlib import Path

import boto3
import pytest
import yaml

from gpufinops import model
from gpufinops.config import PrometheusSettings, load_settings
from tests.faults import iampolicy

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PROM = DEPLOY / "prometheus"
K8S = DEPLOY / "kubernetes"
INVENTORY = ROOT / "gpufinops" / "places" / "ec2" / "cloud.py"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs Debian's prometheus)")
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)


# ---------------------------------------------------------------------- Prometheus


def test_promtool_accepts_the_alert_rules():
    result = _run(_tool("promtool"), "check", "rules", str(PROM / "gpufinops-alerts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_accepts_the_scrape_config():
    result = _run(_tool("promtool"), "check", "config", str(PROM / "prometheus-dcgm-ec2.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_fire_as_their_unit_tests_say():
    result = _run(_tool("promtool"), "test", "rules", str(PROM / "gpufinops-alerts.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_only_use_metrics_the_service_exports():
    from prometheus_client import generate_latest

    from gpufinops.run.service import ServiceMetrics

    metrics = ServiceMetrics()
    metrics.stops.labels("false")  # labelled series appear once touched
    metrics.source_up.labels("prometheus")
    exported = set(re.findall(r"^(gpufinops_\w+)", generate_latest(metrics.registry).decode(), re.M))
    rules = yaml.safe_load((PROM / "gpufinops-alerts.yml").read_text())
    used = {m for g in rules["groups"] for r in g["rules"] for m in re.findall(r"gpufinops_\w+", r["expr"])}
    assert used, "the alert rules reference no gpufinops metric"
    assert used <= exported, f"alerts use metrics the service does not export: {sorted(used - exported)}"


def test_scrape_config_relabels_the_ec2_instance_id_to_the_join_label():
    config = yaml.safe_load((PROM / "prometheus-dcgm-ec2.yml").read_text())
    (dcgm,) = [j for j in config["scrape_configs"] if j.get("ec2_sd_configs")]
    relabels = {(tuple(r.get("source_labels", ())), r.get("target_label")) for r in dcgm["relabel_configs"]}
    assert (("__meta_ec2_instance_id",), PrometheusSettings().instance_label) in relabels
    # The EC2 filter's families are the inventory's default GPU families.
    (type_filter,) = [f for f in dcgm["ec2_sd_configs"][0]["filters"] if f["name"] == "instance-type"]
    assert {v.removesuffix(".*") for v in type_filter["values"]} == set(model_default_families())


def model_default_families() -> tuple[str, ...]:
    from gpufinops.config import AwsSettings

    return AwsSettings().gpu_families


# ---------------------------------------------------------------------- IAM

ACCOUNTS = ROOT / "gpufinops" / "places" / "ec2" / "accounts.py"
TERMINATE_POLICY = DEPLOY / "iam-policy-terminate.json"
OPT_IN = "gpufinops:allow-stop"  # the operator's opt-in tag of the shipped policy (docs/deploy.md)


def _api_calls_in(*paths: Path) -> set[str]:
    """IAM action names ("ec2:StopInstances", "autoscaling:...") of every EC2 and Auto Scaling client
    method the modules name (called, passed or paginated)."""
    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    mappings = {prefix: session.client(service).meta.method_to_api_mapping
                for prefix, service in (("ec2", "ec2"), ("autoscaling", "autoscaling"))}
    names: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text())
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for call in ast.walk(tree):  # get_paginator("describe_instances")
            if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "get_paginator":
                names |= {a.value for a in call.args if isinstance(a, ast.Constant)}
    # A name both clients have (delete_tags, describe_tags) is EC2's here: the module tags only instances.
    autoscaling_only = set(mappings["autoscaling"]) - set(mappings["ec2"])
    return ({f"ec2:{mappings['ec2'][n]}" for n in names if n in mappings["ec2"]}
            | {f"autoscaling:{mappings['autoscaling'][n]}" for n in names if n in autoscaling_only})


def _statements(path: Path = DEPLOY / "iam-policy.json") -> list[dict]:
    return json.loads(path.read_text())["Statement"]


def _actions(stmt: dict) -> list[str]:
    actions = stmt.get("Action", [])
    return [actions] if isinstance(actions, str) else list(actions)


def _allowed(action: str, statements: list[dict] | None = None) -> list[dict]:
    return [
        s for s in (_statements() if statements is None else statements)
        if s["Effect"] == "Allow" and any(fnmatch.fnmatch(action.lower(), a.lower()) for a in _actions(s))
    ]


# The conditions are decided by tests/faults/iampolicy.py, the evaluator the fault proxy enforces in front of
# moto (AWS's semantics for the operators and keys the shipped policies use; it raises on anything else).
# moto cannot check these policies: its IAM enforcement knows the values of no condition key but
# sts:ExternalId, so any conditioned statement would evaluate as if its keys were absent.
def _decide(statements: list[dict], action: str, resource_tags: dict[str, str] | None = None,
            tag_keys: list[str] | None = None) -> str:
    """"Allow", "Deny" (explicit) or "implicit deny" for one EC2 instance request."""
    request_tags = None if tag_keys is None else {k: "v" for k in tag_keys}
    return iampolicy.evaluate(statements, action, iampolicy.instance_arn("i-0abc", "us-east-1", "111111111111"),
                              resource_tags=resource_tags, request_tags=request_tags).effect


def test_iam_policy_grants_every_call_the_inventory_makes():
    calls = _api_calls_in(INVENTORY, ACCOUNTS)
    # The scan itself must find the calls, or this test proves nothing.
    assert {"ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:StopInstances", "ec2:CreateTags",
            "ec2:DescribeSpotInstanceRequests", "autoscaling:DescribeAutoScalingInstances"} <= calls
    both = _statements() + _statements(TERMINATE_POLICY)
    missing = sorted(c for c in calls if not _allowed(c, both))
    assert not missing, f"deploy/iam-policy*.json lack {missing}"
    # Terminate only in the opt-in file, never in the default policy.
    assert not _allowed("ec2:TerminateInstances") and _allowed("ec2:TerminateInstances", _statements(TERMINATE_POLICY))


def test_iam_policy_is_least_privilege():
    for stmt in _statements() + _statements(TERMINATE_POLICY):
        for action in _actions(stmt):
            assert "*" not in action.split(":", 1)[-1] or stmt["Effect"] == "Deny", f"wildcard action {action}"
    # Tags: exactly the keys the service writes; never the ones people set, but the Snooze button may add a snooze
    # where none is set (its own statement: the snooze tag is never rewritten, so the service cannot end one).
    tagging, snoozing = _allowed("ec2:CreateTags")
    (untagging,) = _allowed("ec2:DeleteTags")
    people = {model.TAG_PROTECT, model.TAG_SNOOZE}
    written = {v for k, v in vars(model).items() if k.startswith("TAG_")} - people
    assert set(untagging["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]) == written
    assert set(tagging["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]) == written
    assert snoozing["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"] == [model.TAG_SNOOZE]
    assert snoozing["Condition"]["Null"][f"aws:ResourceTag/{model.TAG_SNOOZE}"] == "true"
    for stmt in (tagging, snoozing, untagging):
        assert _actions(stmt) == [stmt["Action"]] and stmt["Condition"]["Null"]["aws:TagKeys"] == "false"
    for action in ("ce:GetCostAndUsage", "ce:GetCostForecast", "s3:GetObject", "s3:ListBucket",
                   "athena:StartQueryExecution", "athena:GetQueryExecution", "athena:GetQueryResults",
                   "pricing:GetProducts", "ec2:DescribeSpotPriceHistory"):
        assert _allowed(action), action
    assert not _allowed("ec2:RunInstances") and not _allowed("s3:DeleteObject") and not _allowed("ec2:StartInstances")


MARK = {model.TAG_MARKED: "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize("tags, default, with_terminate_file", [
    ({OPT_IN: "true", **MARK}, "Allow", "Allow"),
    ({OPT_IN: "true"}, "implicit deny", "implicit deny"),  # no mark: a stop still in flight after a cancel is fenced
    ({**MARK}, "implicit deny", "implicit deny"),  # not opted in: never stopped, whatever the code decides
    ({}, "implicit deny", "implicit deny"),
    ({OPT_IN: "false", **MARK}, "implicit deny", "implicit deny"),
    ({OPT_IN: "true", **MARK, model.TAG_PROTECT: "yes"}, "Deny", "Deny"),
    ({OPT_IN: "true", **MARK, model.TAG_PROTECT: ""}, "Deny", "Deny"),  # any value but false protects
    ({OPT_IN: "true", **MARK, model.TAG_PROTECT: "FALSE"}, "Allow", "Allow"),
])
def test_iam_stops_only_opted_in_unprotected_instances_and_terminates_only_with_the_opt_in_file(
        tags, default, with_terminate_file):
    policy, terminate = _statements(), _statements() + _statements(TERMINATE_POLICY)
    assert _decide(policy, "ec2:StopInstances", tags) == default
    assert _decide(policy, "ec2:TerminateInstances", tags) in ("implicit deny", "Deny")
    assert _decide(terminate, "ec2:TerminateInstances", tags) == with_terminate_file
    assert _decide(_statements(TERMINATE_POLICY), "ec2:TerminateInstances", tags) == with_terminate_file


@pytest.mark.parametrize("keys, create, delete", [
    ([model.TAG_MARKED], "Allow", "Allow"),
    ([model.TAG_STOPPED_BY, model.TAG_STOPPED_REASON], "Allow", "Allow"),
    ([model.TAG_STOP_REQUESTED], "Allow", "Allow"),
    ([model.TAG_SNOOZE], "Allow", "Deny"),  # the Slack Snooze button sets it; only a person removes it
    ([model.TAG_MARKED, model.TAG_PROTECT], "Deny", "Deny"),
    ([model.TAG_PROTECT], "Deny", "Deny"),
    (["GPUFINOPS:Protect"], "Deny", "Deny"),
    ([OPT_IN], "Deny", "Deny"),  # the service cannot opt an instance in
    (["gpufinops:other"], "implicit deny", "implicit deny"),
    (["team"], "implicit deny", "implicit deny"),
    ([], "implicit deny", "implicit deny"),
])
def test_iam_tag_writes_are_the_services_own_keys_and_never_protect(keys, create, delete):
    assert _decide(_statements(), "ec2:CreateTags", {OPT_IN: "true"}, keys) == create, keys
    assert _decide(_statements(), "ec2:DeleteTags", {OPT_IN: "true"}, keys) == delete, keys


def test_iam_never_lets_the_service_rewrite_or_remove_a_snooze():
    # A person's snooze (or the first click's): a CreateTags with a past time would end it; refused explicitly.
    snoozed = {OPT_IN: "true", **MARK, model.TAG_SNOOZE: "2099-01-01T00:00:00Z"}
    assert _decide(_statements(), "ec2:CreateTags", snoozed, [model.TAG_SNOOZE]) == "Deny"
    assert _decide(_statements(), "ec2:DeleteTags", snoozed, [model.TAG_SNOOZE]) == "Deny"
    assert _decide(_statements(), "ec2:CreateTags", {OPT_IN: "true", **MARK}, [model.TAG_SNOOZE]) == "Allow"


def test_the_opt_in_tag_is_the_one_docs_deploy_names():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    conditions = [s["Condition"] for s in _statements() + _statements(TERMINATE_POLICY)
                  if s["Effect"] == "Allow" and set(_actions(s)) & {"ec2:StopInstances", "ec2:TerminateInstances"}]
    fence = {"StringEquals": {f"aws:ResourceTag/{OPT_IN}": "true"},
             "Null": {f"aws:ResourceTag/{model.TAG_MARKED}": "false"}}  # opted in and still marked
    assert len(conditions) == 2 and all(c == fence for c in conditions)
    assert f"`{OPT_IN}=true`" in doc and "iam-policy-terminate.json" in doc


# ---------------------------------------------------------------------- Kubernetes and Docker


def _manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[doc["kind"]] = doc
    return docs


def test_kubernetes_manifests_have_the_expected_kinds():
    kinds = _manifests()
    assert set(kinds) == {"Namespace", "ServiceAccount", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"}
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_deployment_runs_one_replica_that_never_overlaps():
    k = _manifests()
    dep = k["Deployment"]
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert spec["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert k["Service"]["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # Probes, port and Service agree.
    (port,) = container["ports"]
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"]["path"] == path
        assert container[probe]["httpGet"]["port"] in (port["name"], port["containerPort"])
    (svc_port,) = k["Service"]["spec"]["ports"]
    assert port["containerPort"] == svc_port["port"] == 9108 and svc_port["targetPort"] == port["name"]
    # Secrets by reference only; volumes point at the shipped PVC and ConfigMap.
    env = {e["name"]: e for e in container["env"]}
    assert env["SLACK_BOT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "gpufinops-slack"
    assert all("value" not in env[n] for n in ("SLACK_BOT_TOKEN", "GPUFINOPS_PROMETHEUS_TOKEN"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == k["PersistentVolumeClaim"]["metadata"]["name"]
    assert volumes["config"]["configMap"]["name"] == k["ConfigMap"]["metadata"]["name"]
    assert pod["serviceAccountName"] == k["ServiceAccount"]["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_configmap_is_a_valid_gpufinops_config_that_keeps_state_on_the_volume(tmp_path):
    k = _manifests()
    container = k["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    config_file = tmp_path / "gpufinops.yaml"
    config_file.write_text(k["ConfigMap"]["data"]["gpufinops.yaml"])

    settings = load_settings(config_file)  # raises ConfigError naming file:line on a bad key

    assert env["GPUFINOPS_CONFIG"] == f"{mounts['config']}/gpufinops.yaml"
    assert settings.database_url == f"sqlite:///{mounts['data']}/gpufinops.db"
    assert settings.slack.outbox_path.startswith(mounts["data"] + "/")
    assert settings.service.host == "0.0.0.0" and settings.service.port == 9108
    assert settings.act.dry_run is True  # a fresh deployment never stops anything
    # python:3.11-slim's prefix is /usr/local; pyproject's data-files install the rules under it.
    assert settings.rules_paths == ("/usr/local/share/gpufinops/rules",)
    assert '"share/gpufinops/rules" = ["rules/*.yaml"]' in (ROOT / "pyproject.toml").read_text()


def test_dockerfile_builds_a_non_root_serve_image_from_files_that_exist():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    # Multi-stage: the wheel is built in the first stage, the slim runtime installs only that wheel.
    assert lines[0] == "FROM python:3.11-slim AS build"
    assert [ln for ln in lines if ln.startswith("FROM ")][-1] == "FROM python:3.11-slim"
    assert "python -m build --wheel" in text and "pip install /tmp/dist/gpufinops-*.whl" in text
    for line in lines:
        if line.startswith("COPY ") and not line.startswith("COPY --from="):
            *sources, dest = line.split()[1:]
            for src in sources:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, missing in the repository"
    copied = {src for line in lines if line.startswith("COPY ") for src in line.split()[1:-1]}
    # The wheel needs both to ship them as data files (rules/ and the report templates).
    assert {"rules", "reports", "gpufinops", "pyproject.toml"} <= copied
    (user,) = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    uid = user.split(":")[0]
    assert uid.isdigit() and uid != "0"
    pod = _manifests()["Deployment"]["spec"]["template"]["spec"]
    assert str(pod["securityContext"]["runAsUser"]) == uid
    assert 'CMD ["serve"]' in lines and 'ENTRYPOINT ["gpufinops"]' in lines
    assert "EXPOSE 9108" in lines


def test_kustomize_renders_everything_into_one_namespace():
    result = _run(_tool("kubectl"), "kustomize", str(K8S))
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {d["kind"] for d in docs} == set(_manifests())
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"gpufinops"}
