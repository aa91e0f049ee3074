"""11: a bench through a prefill/decode gateway names the fleet it ran on: the gateway, and each
server's host, role, profile and digest (JSON in bench_results.fleet; "" for one server)."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import TEXT

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.add_column("bench_results", sa.Column("fleet", TEXT, nullable=False, server_default=sa.text("''")))


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
