"""The composition root: the one place that turns settings into the live peers.

EC2 (or several accounts), Prometheus (the tick's window reader and the right-sizing reader), the database and
Slack (or the outbox). `serve`, `evaluate`, `recommend`, the billing commands and the scheduled jobs all get their
peers from here, so a setting means the same thing to each. The demo builds its simulated peers itself
(gpufinops.demo): nothing in it is live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import Settings
from .model import utcnow

if TYPE_CHECKING:
    from .model import Cloud, Notifier
    from .pipeline import Peers
    from .recommend.usage import PrometheusUsage
    from .store import Store


def live_store(settings: Settings) -> "Store":
    from .collect.billing import schema as _billing_tables  # noqa: F401 - registers the costs table
    from .store import Store

    return Store(settings.database_url)


def live_cloud(settings: Settings, with_prices: bool = True) -> "Cloud":
    """EC2 across the configured regions and accounts; with_prices: on-demand prices fill in an hourly rate."""
    from .collect.accounts import build_cloud
    from .prices import OnDemandPrices

    return build_cloud(settings.aws, prices=OnDemandPrices.load_default()) if with_prices else build_cloud(settings.aws)


def live_inventory(settings: Settings) -> "Cloud":
    """What a tick judges: EC2 (live_cloud) and the rented hosts of `hosts.inventory`, side by side. A config with
    hosts and no `aws:` section is a rented-only fleet: no EC2 call is made."""
    from .collect.static_hosts import WithRentedHosts, static_hosts_cloud

    hosts = static_hosts_cloud(settings)
    if hosts is None:
        return live_cloud(settings)
    ec2 = live_cloud(settings) if "aws" in settings.model_fields_set else None
    return WithRentedHosts(ec2, hosts)


def live_notifier(settings: Settings, store: "Store") -> "Notifier":
    from .notify import build_notifier

    return build_notifier(settings.slack, store, utcnow)


def live_usage(settings: Settings) -> "PrometheusUsage":
    """Days of fleet usage for right-sizing, read with the collector's auth, TLS, labels and errors."""
    from .recommend.usage import PrometheusUsage

    return PrometheusUsage(settings.prometheus)


def live_peers(settings: Settings) -> "Peers":
    """Everything a tick and the scheduled jobs talk to."""
    from .collect.prometheus import PrometheusMetrics
    from .pipeline import Peers

    store = live_store(settings)
    cloud, metrics = live_inventory(settings), PrometheusMetrics(settings.prometheus)
    if settings.kubernetes is not None:  # GPU workloads judged (and scaled to zero) beside the instances
        from .fleet import live_fleet

        cloud, metrics = live_fleet(settings, cloud, metrics)
    return Peers(cloud, metrics, store, live_notifier(settings, store), usage=live_usage(settings))
