"""Alembic environment: always called with a connection the store already holds in a transaction (and its
schema lock), see gpufinops.store.create_schema. No engine is made here and no transaction begun: the
caller commits the migration with the rest of the schema check."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transactional_ddl=True)
context.run_migrations()
