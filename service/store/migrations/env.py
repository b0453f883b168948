"""Alembic's environment: runs the revisions on the connection that service.store.database
hands over (in `config.attributes["connection"]`), inside the transaction it has begun and
holds a lock in, so that replicas starting together migrate one after the other and a
migration cut short leaves nothing half done (DDL is transactional on SQLite and PostgreSQL)."""

from __future__ import annotations

from alembic import context

from service.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the store's migrations run through service.store (`nmt db upgrade`, or at the "
        "server's start), which opens the database from NMT_DATABASE_URL"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite alters a table by copying it: later revisions use op.batch_alter_table for that.
    render_as_batch=connection.dialect.name == "sqlite",
    transactional_ddl=True,
)
with context.begin_transaction():  # the caller's transaction: this adds none
    context.run_migrations()
