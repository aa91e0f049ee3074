"""10: a ledger a team shares. Each row names the control machine that wrote it (origin). A row a
push copied names where it came from (pushed_from: LEDGER_ID:ROW_ID), once. A campaign names who
runs it now (holder) and when that one last said so (heartbeat). ledger_info holds the ledger's own
id and when each machine last wrote."""

import uuid

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import REAL, TEXT

revision = "0010"
down_revision = "0009"


def _origin() -> sa.Column[str]:
    return sa.Column("origin", TEXT, nullable=False, server_default=sa.text("''"))


def upgrade() -> None:
    for table in ("deploys", "bench_results", "trials", "adoptions"):
        op.add_column(table, _origin())
        op.add_column(table, sa.Column("pushed_from", TEXT))
        op.create_index(f"{table}_pushed_from", table, ["pushed_from"], unique=True)
    for table in ("last_good", "good_units"):
        op.add_column(table, _origin())
    op.create_index("bench_sweep", "bench_results", ["sweep_id"])  # a campaign's rows, of 100,000
    op.add_column("campaigns", _origin())
    op.add_column("campaigns", sa.Column("holder", TEXT, nullable=False, server_default=sa.text("''")))
    op.add_column("campaigns", sa.Column("heartbeat", REAL))
    info = op.create_table(
        "ledger_info",
        sa.Column("key", TEXT, primary_key=True),
        sa.Column("value", TEXT, nullable=False),
    )
    op.bulk_insert(info, [{"key": "ledger_id", "value": uuid.uuid4().hex}])


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
