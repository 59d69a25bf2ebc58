"""The composition root: the one place that turns settings into the live peers.

EC2 (or several accounts), Prometheus (the tick's window reader and the right-sizing reader), the database and
Slack (or the outbox). `serve`, `evaluate`, `recommend`, the billing commands and the scheduled jobs all get their
peers from here, so a setting means the same thing to each. The demo builds its simulated peers itself
(gpufinops.demo): nothing in it is live.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from ..collect.billing.settings import billing_settings
from ..collect.prometheus import PrometheusMetrics
from ..config import ConfigError, Settings
from ..k8s.model import ClusterSnapshot
from ..model import Cloud, MetricsSource, Notifier, utcnow
from ..notify.delivery import build_notifier
from ..notify.email import EmailDelivery
from ..notify.routing import Deliveries
from ..places.azure.cloud import WithAzure, azure_cloud
from ..places.ec2.accounts import build_cloud
from ..places.gcp.cloud import GceCloud
from ..places.gcp.fleet import WithGce
from ..places.gcp.labels import LabelError, encode_key, encode_value
from ..prices.catalog import load_catalog
from ..prices.gcp_refresh import load_gcp_refresh, with_gcp_refresh
from ..places.fleet import FleetCloud, FleetMetrics, WithRentedHosts, WithSlurm, WithSlurmMetrics, WorkloadMetrics
from ..places.hosts import static_hosts_cloud
from ..places.kubernetes.cloud import WorkloadCloud
from ..places.kubernetes.cluster import KubernetesCluster
from ..places.kubernetes.costs import CostShare, attribute, node_hourly_costs
from ..places.kubernetes.usage import PodMetrics
from ..places.slurm.cloud import SlurmCloud
from ..places.slurm.commands import SlurmCommands
from ..places.slurm.jobs import parse_subject_id
from ..places.slurm.usage import SlurmJobMetrics
from ..prices.prices import OnDemandPrices
from ..recommend.usage import PrometheusUsage
from ..store.store import Store
from .pipeline import Peers
from .shards import owned_only


def live_store(settings: Settings) -> Store:
    return Store(settings.database_url)


def live_cloud(settings: Settings, with_prices: bool = True) -> Cloud:
    """EC2 across the configured regions and accounts; with_prices: on-demand prices fill in an hourly rate."""
    return build_cloud(settings.aws, prices=OnDemandPrices.load_default()) if with_prices else build_cloud(settings.aws)


def live_inventory(settings: Settings) -> Cloud:
    """What a tick judges: EC2 (live_cloud), the rented hosts of `hosts.inventory`, the Azure VMs of `azure:` and the
    GCE VMs of `gcp:`, side by side. A config with hosts, Azure or GCP and no `aws:` section makes no EC2 call."""
    hosts = static_hosts_cloud(settings)
    azure = azure_cloud(settings)
    with_ec2 = "aws" in settings.model_fields_set or (hosts is None and azure is None and settings.gcp is None)
    ec2 = live_cloud(settings) if with_ec2 else None
    inventory = ec2 if hosts is None else WithRentedHosts(ec2, hosts)
    if azure is not None:
        inventory = WithAzure(inventory, azure)
    if settings.gcp is not None:
        inventory = WithGce(inventory, live_gce(settings))
    return inventory


def live_gce(settings: Settings) -> GceCloud:
    """The GCE VMs of the `gcp:` projects, priced from the bundled catalog. The official client is the `gcp`
    extra: a config naming `gcp:` without it is an error that says so, never a traceback."""
    try:
        from google.cloud import compute_v1
        del compute_v1  # only to say what is missing
    except ImportError as exc:
        raise ConfigError(f"{settings.source_path or 'config'}: gcp: needs the Compute Engine client: "
                          f"pip install 'gpufinops[gcp]' ({exc})") from exc
    check_opt_in_label(settings)
    catalog = load_catalog()
    refreshed = load_gcp_refresh(settings.gcp.price_cache_path)  # written by `recommend --refresh-prices`
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return GceCloud(settings.gcp, catalog=with_gcp_refresh(catalog, refreshed) if refreshed else catalog)
    except DefaultCredentialsError as exc:
        raise ConfigError(f"{settings.source_path or 'config'}: gcp: no Google credentials in the environment: set "
                          f"{settings.gcp.access_token.env or 'gcp.access_token'} (an access token) or "
                          f"GOOGLE_APPLICATION_CREDENTIALS, or run on a host with a service account ({exc})") from exc


def check_opt_in_label(settings: Settings) -> None:
    """The opt-in tag must be a GCE label a person can set (and its value one), else no VM could ever be opted in."""
    key, value = settings.act.opt_in_tag, settings.act.opt_in_value
    try:
        encode_key(key)
    except LabelError as exc:
        raise ConfigError(f"{settings.source_path or 'config'}: act.opt_in_tag: {exc}") from exc
    if encode_value(key, value) != value:
        raise ConfigError(f"{settings.source_path or 'config'}: act.opt_in_value: {value!r} cannot be a GCE label "
                          f"value (lowercase letters, digits, '_' and '-', at most 63 characters)")


def live_notifier(settings: Settings, store: Store) -> Notifier:
    """Every delivery behind the router (notify/routing.py): Slack or the outbox, and email when enabled."""
    email = EmailDelivery(settings.email, store, utcnow) if settings.email.enabled else None
    return Deliveries(build_notifier(settings.slack, store, utcnow), settings, email)


def live_usage(settings: Settings) -> PrometheusUsage:
    """Days of fleet usage for right-sizing, read with the collector's auth, TLS, labels and errors."""
    return PrometheusUsage(settings.prometheus)


def live_peers(settings: Settings) -> Peers:
    """Everything a tick and the scheduled jobs talk to."""
    store = live_store(settings)
    # A replica with `prometheus.owned_shards` lists (so judges and acts on) its own shards' instances only.
    slurm = settings.slurm.enabled if settings.slurm is not None else ()
    if slurm and settings.kubernetes is None and "aws" not in settings.model_fields_set \
            and settings.gcp is None and settings.azure is None and static_hosts_cloud(settings) is None:
        cloud, metrics = None, None  # a Slurm-only fleet: no EC2 call is made
    else:
        cloud, metrics = owned_only(live_inventory(settings), settings), PrometheusMetrics(settings.prometheus)
        if settings.kubernetes is not None:  # GPU workloads judged (and scaled to zero) beside the instances
            cloud, metrics = live_fleet(settings, cloud, metrics)
    if slurm:  # each RUNNING GPU job of the clusters judged (and requeued, held or cancelled) beside the rest
        cloud, metrics = live_slurm(settings, cloud, metrics)
    return Peers(cloud, metrics, store, live_notifier(settings, store), usage=live_usage(settings),
                 scope_tag_keys=billing_settings(settings).tag_keys)


def live_workload_cloud(settings: Settings, clock: Callable[[], datetime] | None = None) -> WorkloadCloud:
    """The cluster named by `settings.kubernetes` as a Cloud (nothing is read until it is listed)."""
    cluster = KubernetesCluster.from_settings(settings.kubernetes, settings.source_path)
    return WorkloadCloud(cluster, price_lookup(settings), protect_key=settings.kubernetes.protect_key,
                         scale_to_zero=settings.kubernetes.scale_to_zero,
                         suspend_kueue=settings.kubernetes.suspend_kueue,
                         drain_nodes=settings.kubernetes.drain_nodes, clock=clock or utcnow)


def live_fleet(settings: Settings, ec2: Cloud, ec2_metrics: MetricsSource,
               clock: Callable[[], datetime] | None = None) -> tuple[FleetCloud, FleetMetrics]:
    """EC2 and the cluster side by side (compose.live_peers, when the config has a `kubernetes:` section)."""
    workloads = live_workload_cloud(settings, clock)
    return FleetCloud(ec2, workloads), FleetMetrics(ec2_metrics, WorkloadMetrics(PodMetrics(settings.prometheus),
                                                                                 workloads))


def live_slurm(settings: Settings, cloud: Cloud | None, metrics: MetricsSource | None,
               clock: Callable[[], datetime] | None = None, runner=None) -> tuple[WithSlurm, WithSlurmMetrics]:
    """The enabled Slurm clusters beside `cloud` (None: Slurm only). `runner`: how their commands are run (the
    tests run them as the Operator user; the service runs as that user itself)."""
    clusters = []
    for c in settings.slurm.enabled:
        commands = SlurmCommands(c.cluster, c.conf, c.timeout_s, **({"runner": runner} if runner else {}))
        clusters.append(SlurmCloud(c, commands, clock=clock or utcnow))
    by_name = {c.cluster: c for c in clusters}

    def basis(subject_id: str):
        cluster, _ = parse_subject_id(subject_id)
        return by_name[cluster].usage_basis(subject_id)

    def index_map(subject_id: str):
        return by_name[parse_subject_id(subject_id)[0]].settings.gpu_index_map

    return WithSlurm(cloud, clusters), WithSlurmMetrics(metrics, SlurmJobMetrics(settings.prometheus, basis,
                                                                                 index_map))


@dataclass(frozen=True)
class ClusterCosts:
    snapshot: ClusterSnapshot
    node_costs: dict[str, float | None]  # USD/h per node name
    shares: list[CostShare]


def price_lookup(settings: Settings) -> OnDemandPrices:
    """`price(instance_type, region, lifecycle) -> USD/h | None`: billing.price_catalog, else the bundled one."""
    path = settings.billing.price_catalog if settings.billing is not None else None
    return OnDemandPrices.load(path) if path else OnDemandPrices.load_default()


def live_cluster_costs(settings: Settings, now: datetime, hours: float = 1.0) -> ClusterCosts:
    """Read the cluster named by `settings.kubernetes` now and split its GPU nodes' cost over `hours`
    (places.kubernetes.cluster.ClusterReadFailed when the API does not answer: never an empty cluster)."""
    snapshot = KubernetesCluster.from_settings(settings.kubernetes, settings.source_path).snapshot(now)
    costs = node_hourly_costs(snapshot.nodes, price_lookup(settings))
    return ClusterCosts(snapshot, costs, attribute(snapshot, costs, hours))
