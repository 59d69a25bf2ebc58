"""Store: the database. `schema` (every table, the billing costs and recommendations included, and the row
types), `store` (the `Store` facade), `migrate` (engine, schema build and Alembic migrations in `migrations/`),
`rollups` (verdict episodes and hourly rollups written with each tick), `episodes` (the pure fold they use).

SQLite (WAL) or Postgres. Nothing registers a table by being imported: schema.py defines them all.
May import: model. Never imports collect, places, decide, act, notify, run or anything above.
"""
