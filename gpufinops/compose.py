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
    return Peers(live_cloud(settings), PrometheusMetrics(settings.prometheus), store,
                 live_notifier(settings, store), usage=live_usage(settings))
