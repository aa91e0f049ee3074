"""Alembic's environment for the ledger: it runs on the connection the ledger opened.

orchestrator/ledger/store.py calls Alembic with that connection in `config.attributes`, inside
its own transaction, so a migration is all or nothing.
"""

from alembic import context

from orchestrator.ledger import schema

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=schema.metadata, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
