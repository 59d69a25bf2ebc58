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
from ..config import Settings
from ..k8s.model import ClusterSnapshot
from ..model import Cloud, MetricsSource, Notifier, utcnow
from ..notify.delivery import build_notifier
from ..notify.email import EmailDelivery
from ..notify.routing import Deliveries
from ..places.azure.cloud import WithAzure, azure_cloud
from ..places.ec2.accounts import build_cloud
from ..places.fleet import FleetCloud, FleetMetrics, WithRentedHosts, WorkloadMetrics
from ..places.hosts import static_hosts_cloud
from ..places.kubernetes.cloud import WorkloadCloud
from ..places.kubernetes.cluster import KubernetesCluster
from ..places.kubernetes.costs import CostShare, attribute, node_hourly_costs
from ..places.kubernetes.usage import PodMetrics
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
    """What a tick judges: EC2 (live_cloud), the Azure VMs of `azure:` and the rented hosts of `hosts.inventory`,
    side by side. A config with hosts or Azure and no `aws:` section makes no EC2 call."""
    hosts = static_hosts_cloud(settings)
    azure = azure_cloud(settings)
    if hosts is None and azure is None:
        return live_cloud(settings)
    cloud = live_cloud(settings) if "aws" in settings.model_fields_set else None
    if azure is not None:
        cloud = WithAzure(cloud, azure)
    return WithRentedHosts(cloud, hosts) if hosts is not None else cloud


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
    cloud, metrics = owned_only(live_inventory(settings), settings), PrometheusMetrics(settings.prometheus)
    if settings.kubernetes is not None:  # GPU workloads judged (and scaled to zero) beside the instances
        cloud, metrics = live_fleet(settings, cloud, metrics)
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
