"""Alembic migrations of the store's schema (gpufinops/store.py).

`gpufinops.store.create_schema` runs them on start, inside its schema lock, before `create_all` (which still
creates capability tables and `add_missing_columns`, which still adds new nullable columns). A database from
before Alembic (tables, no `alembic_version`) is stamped at the baseline first. A change that is not
additive (a new NOT NULL column, a changed type, data to move) needs a revision here: `alembic revision` with
this folder as script_location, then set HEAD below to it.
"""

from pathlib import Path

SCRIPT_LOCATION = Path(__file__).resolve().parent
BASELINE = "0001"
HEAD = "0006"  # the newest revision in versions/; tests check it is the script head
# kv key a revision sets when stored decision rows must be folded into episodes and rollups (0002).
BACKFILL_KEY = "store:rollup_backfill_pending"
