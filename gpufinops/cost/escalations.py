"""The stored budget escalations: `record` (once per budget and month, written by the budget job) and
`active` (read by the tick). The escalation itself and the pure promotion of decisions are decide.escalation.
"""

from __future__ import annotations

import json
from datetime import datetime

from ..decide.escalation import KV_PREFIX, Escalation
from ..store.store import Store


def record(store: Store, esc: Escalation) -> bool:
    """Store the escalation once per budget and month; True when it is new."""
    if store.get_kv(esc.key()) is not None:
        return False
    store.set_kv(esc.key(), json.dumps(esc.__dict__))
    return True


def active(store: Store, now: datetime) -> list[Escalation]:
    period = f"{now:%Y-%m}"
    return [Escalation(**json.loads(v)) for _, v in store.kv_items(f"{KV_PREFIX}{period}:")]
