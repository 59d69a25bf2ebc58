"""A monitored install (issue 27): `kubectl kustomize` renders the base, the workloads RBAC and the monitored overlay;
every built-in object is rebuilt through the official `kubernetes` client's models (kind and apiVersion known to
the client, no unknown field, every required field, the model's types); the Prometheus Operator objects carry what
the operator needs, scrape the base's Service and hold exactly the alert rules of deploy/prometheus, which promtool
checks and unit-tests again as rendered. The systemd unit for `serve` is checked by systemd-analyze, against the
agent's hardening and through the real command-line parser."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import kubernetes.client
import pytest
import yaml
from kubernetes.client import ApiClient, Configuration

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
PROM = DEPLOY / "prometheus"
SYSTEMD = DEPLOY / "systemd"
COMPONENT = K8S / "components" / "monitoring"
OVERLAY = DEPLOY / "overlays" / "monitored"
NAMESPACE = "gpufinops"
MONITORING = "monitoring.coreos.com/v1"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian: kubectl for kustomize, prometheus for promtool, "
                    "systemd for systemd-analyze)")
    return path


def _run(*cmd: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


@cache
def _rendered(folder: Path) -> tuple[dict, ...]:
    result = _run(_tool("kubectl"), "kustomize", str(folder))
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


# ---------------------------------------------------------------------- the client's models as the schema

_PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,),
               "datetime": (str,), "date": (str,)}


def _strict() -> Configuration:
    config = Configuration()
    config.client_side_validation = True  # the models' setters refuse a missing required field
    return config


def build_model(value, type_name: str, path: str):
    """`value` (parsed YAML) as the client's model `type_name` (e.g. "V1Deployment"), recursively, as
    ApiClient.deserialize would, but strict: an unknown field, a wrong type or a missing required field raises
    ValueError naming the path. The client itself drops unknown fields silently."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            raise ValueError(f"{path}: expected a list ({type_name}), got {value!r}")
        return [build_model(v, type_name[5:-1], f"{path}[{i}]") for i, v in enumerate(value)]
    if type_name.startswith("dict("):
        inner = type_name[type_name.index(",") + 1:-1].strip()
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"{path}: expected a map ({type_name}), got {value!r}")
        return {k: build_model(v, inner, f"{path}.{k}") for k, v in value.items()}
    if type_name in _PRIMITIVES:
        if not isinstance(value, _PRIMITIVES[type_name]) or (isinstance(value, bool) and type_name in ("int", "float")):
            raise ValueError(f"{path}: expected {type_name}, got {value!r}")
        return value
    cls = getattr(kubernetes.client.models, type_name)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected an object ({type_name}), got {value!r}")
    attribute = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    unknown = sorted(set(value) - set(attribute))
    if unknown:
        raise ValueError(f"{path}: {type_name} has no field {unknown}")
    kwargs = {attribute[k]: build_model(v, cls.openapi_types[attribute[k]], f"{path}.{k}") for k, v in value.items()}
    try:
        return cls(local_vars_configuration=_strict(), **kwargs)
    except ValueError as exc:
        raise ValueError(f"{path}: {type_name}: {exc}") from exc


def api_of(api_version: str):
    """The client's API class serving `api_version`: "v1" -> CoreV1Api, "apps/v1" -> AppsV1Api,
    "rbac.authorization.k8s.io/v1" -> RbacAuthorizationV1Api; None when the client has none (a CRD)."""
    group, _, version = api_version.rpartition("/")
    words = group.removesuffix(".k8s.io").split(".") if group else ["core"]
    return getattr(kubernetes.client, "".join(w.capitalize() for w in words) + version.capitalize() + "Api", None)


def check_builtin(doc: dict) -> bool:
    """Checks one rendered built-in object against the client; returns whether its kind is namespaced."""
    api = api_of(doc["apiVersion"])
    assert api is not None, f"{doc['kind']}: the kubernetes client knows no API {doc['apiVersion']}"
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", doc["kind"]).lower()
    namespaced = hasattr(api, f"create_namespaced_{snake}")
    assert namespaced or hasattr(api, f"create_{snake}"), f"{api.__name__} serves no kind {doc['kind']}"
    model_name = doc["apiVersion"].rpartition("/")[2].capitalize() + doc["kind"]
    assert hasattr(kubernetes.client.models, model_name), model_name
    obj = build_model(doc, model_name, f"{doc['kind']}/{doc['metadata'].get('name')}")
    assert (obj.api_version, obj.kind) == (doc["apiVersion"], doc["kind"])
    assert obj.metadata is not None and obj.metadata.name, f"{doc['kind']} without metadata.name"
    # Nothing lost on the way: the model serializes back to the rendered object.
    assert ApiClient().sanitize_for_serialization(obj) == doc
    return namespaced


@pytest.mark.parametrize("doc, error", [
    ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
      "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}, "selector"),
    ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
      "spec": {"selector": {}, "template": {"spec": {"containers": [{"image": "i"}]}}}}, "name"),
    ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replcias": 1}}, "replcias"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": "9108"}]}},
     "expected int"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x", "labels": {"a": 1}}}, "expected str"),
])
def test_the_model_check_refuses_what_an_api_server_would(doc, error):
    with pytest.raises(ValueError, match=error):
        check_builtin(doc)


def test_the_model_check_knows_kinds_by_their_api_group():
    with pytest.raises(AssertionError, match="serves no kind Deployment"):
        check_builtin({"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "x"}})
    with pytest.raises(AssertionError, match="knows no API"):
        check_builtin({"apiVersion": MONITORING, "kind": "ServiceMonitor", "metadata": {"name": "x"}})


# ---------------------------------------------------------------------- rendered objects


@pytest.mark.parametrize("folder", [K8S, K8S / "workloads", OVERLAY], ids=["base", "workloads", "monitored"])
def test_every_rendered_object_is_valid_for_the_kubernetes_client(folder):
    docs = _rendered(folder)
    assert docs
    for doc in docs:
        if doc["apiVersion"] == MONITORING:
            assert doc["metadata"]["namespace"] == NAMESPACE
            continue  # no model in the client: the operator's own checks below
        namespaced = check_builtin(doc)
        assert doc["metadata"].get("namespace") == (NAMESPACE if namespaced else None), doc["kind"]


def test_the_base_renders_without_the_optional_component_and_the_overlay_only_adds_it():
    base, overlay = _rendered(K8S), _rendered(OVERLAY)
    assert not [d for d in base if d["apiVersion"] == MONITORING]
    added = [d for d in overlay if d not in base]
    assert sorted((d["apiVersion"], d["kind"]) for d in added) == [(MONITORING, "PrometheusRule"),
                                                                   (MONITORING, "ServiceMonitor")]
    assert len(overlay) == len(base) + 2
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    # The overlay's example patch reaches both objects (the label a Prometheus selects them by).
    assert all(d["metadata"]["labels"]["release"] == "kube-prometheus-stack" for d in added)


def _one(docs, kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_the_service_monitor_scrapes_the_services_metrics_port_as_the_job_the_alerts_watch():
    docs = _rendered(OVERLAY)
    monitor = _one(docs, "ServiceMonitor")
    spec = monitor["spec"]
    assert monitor["metadata"]["name"]
    build_model(spec["selector"], "V1LabelSelector", "ServiceMonitor.spec.selector")
    services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["namespace"] == NAMESPACE
                and spec["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()]
    (service,) = services  # the selector matches the base's Service, and only it
    assert "namespaceSelector" not in spec  # its own namespace, the Service's
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert spec["endpoints"] and all(e["port"] in port_names and e["path"] == "/metrics" for e in spec["endpoints"])
    # The operator names the job after the Service (no jobLabel): the job GpufinopsDown's `up{job=...}` selects.
    rules = yaml.safe_load((PROM / "gpufinops-alerts.yml").read_text())
    (down,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpufinopsDown"]
    assert "jobLabel" not in spec and f'job="{service["metadata"]["name"]}"' in down["expr"]
    # Scraped while not ready: a degraded source is when the metrics matter.
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_the_prometheus_rule_is_the_alert_file_and_promtool_checks_and_tests_it_as_rendered(tmp_path):
    promtool = _tool("promtool")
    rule = _one(_rendered(OVERLAY), "PrometheusRule")
    assert rule["metadata"]["name"]
    groups = rule["spec"]["groups"]
    assert groups == yaml.safe_load((PROM / "gpufinops-alerts.yml").read_text())["groups"], (
        "deploy/kubernetes/components/monitoring/prometheusrule.yaml differs from deploy/prometheus/"
        "gpufinops-alerts.yml: copy the file's groups under spec:")
    for group in groups:  # what the operator's CRD requires
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert r["expr"] and (("alert" in r) != ("record" in r)), r
    extracted = tmp_path / "gpufinops-alerts.yml"  # the name the unit tests' rule_files give
    extracted.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(PROM / "gpufinops-alerts.test.yml", tmp_path)
    checked = _run(promtool, "check", "rules", str(extracted))
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr
    tested = _run(promtool, "test", "rules", "gpufinops-alerts.test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# ---------------------------------------------------------------------- systemd unit for serve

SERVE_UNIT = SYSTEMD / "gpufinops-serve.service"
AGENT_UNIT = SYSTEMD / "gpufinops-agent.service"
HARDENING = re.compile(r"^(NoNewPrivileges|Private\w+|Protect\w+|Restrict\w+|LockPersonality|SystemCall\w+|"
                       r"CapabilityBoundingSet|AmbientCapabilities|MemoryDenyWriteExecute)$")


def _unit(path: Path) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert key not in current, f"{path.name}: {key} twice"
        current[key] = value
    return sections


def test_the_serve_unit_runs_non_root_with_a_state_dir_and_at_least_the_agents_hardening():
    serve, agent = _unit(SERVE_UNIT)["Service"], _unit(AGENT_UNIT)["Service"]
    assert serve["User"] == agent["User"] == "gpufinops" and serve["Group"] == "gpufinops"
    assert serve["StateDirectory"] == agent["StateDirectory"] == "gpufinops"
    assert serve["Restart"] == "on-failure"
    agent_hardening = {k: v for k, v in agent.items() if HARDENING.match(k)}
    assert len(agent_hardening) > 15
    # Tighter where serve needs less than the agent (no nvidia-smi devices, no netlink), equal everywhere else.
    tighter = {"PrivateDevices": "yes"}
    for key, value in agent_hardening.items():
        if key == "RestrictAddressFamilies":
            assert set(serve[key].split()) <= set(value.split()), key
        else:
            assert serve.get(key) == tighter.get(key, value), key
    assert serve["ProtectProc"] == "invisible"
    # As long as the Deployment gives a running evaluation to finish after SIGTERM.
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    assert serve["TimeoutStopSec"] == f"{deployment['spec']['template']['spec']['terminationGracePeriodSeconds']}s"


def test_the_serve_units_command_line_parses_with_the_real_parser():
    from gpufinops.cli import build_parser

    serve, agent = _unit(SERVE_UNIT)["Service"], _unit(AGENT_UNIT)["Service"]
    argv = shlex.split(serve["ExecStart"])
    assert argv[0] == shlex.split(agent["ExecStart"])[0]  # the same install (docs/agent.md's venv)
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve" and args.config == "/etc/gpufinops/gpufinops.yaml"
    assert args.dry_run is False  # the config's act.dry_run decides (true until the operator changes it)


def test_the_serve_unit_keeps_secrets_out_of_the_unit():
    serve = _unit(SERVE_UNIT)["Service"]
    assert serve["EnvironmentFile"] == "-/etc/gpufinops/serve.env"
    inline = " ".join(v for k, v in serve.items() if k == "Environment")
    assert not re.search(r"TOKEN|SECRET|PASSWORD|KEY", inline, re.I), inline
    shipped = [ln for ln in (SYSTEMD / "serve.env").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert shipped == []  # only commented placeholders: nothing to leak from the repository
    names = re.findall(r"^#(\w+)=", (SYSTEMD / "serve.env").read_text(), re.M)
    assert {"SLACK_BOT_TOKEN", "GPUFINOPS_PROMETHEUS_TOKEN"} <= set(names)


def test_systemd_analyze_verifies_the_serve_unit_and_rates_it_no_more_exposed_than_the_agent(tmp_path):
    analyze = _tool("systemd-analyze")
    # verify also checks that ExecStart's program exists: point it at this checkout's gpufinops.
    gpufinops = shutil.which("gpufinops") or str(ROOT / ".venv" / "bin" / "gpufinops")
    assert Path(gpufinops).exists(), "gpufinops is not installed (pip install -e .)"
    unit = tmp_path / SERVE_UNIT.name
    argv0 = shlex.split(_unit(SERVE_UNIT)["Service"]["ExecStart"])[0]
    unit.write_text(SERVE_UNIT.read_text().replace(argv0, gpufinops))
    verified = _run(analyze, "verify", str(unit))
    complaints = [ln for ln in verified.stderr.splitlines() if unit.name in ln]
    assert verified.returncode == 0 and not complaints, verified.stderr

    def exposure(path: Path) -> float:
        result = _run(analyze, "security", "--offline=yes", str(path))
        match = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)
        assert match, result.stdout + result.stderr
        return float(match.group(1))

    assert exposure(SERVE_UNIT) <= exposure(AGENT_UNIT)
