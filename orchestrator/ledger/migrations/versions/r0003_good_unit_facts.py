"""3: what a good unit means (playvars.UnitFacts as JSON: port, bind, GPUs, health URL, rank), kept
with it so a rollback never reads them back out of the unit text. Older rows keep '{}'."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import TEXT

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    for table in ("last_good", "good_units"):
        op.add_column(table, sa.Column("facts", TEXT, nullable=False, server_default=sa.text("'{}'")))


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
