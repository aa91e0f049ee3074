"""6: a deploy's target model (its path) and the phases of its start ([{phase, s}] as JSON)."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import TEXT

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.add_column("deploys", sa.Column("model", TEXT, nullable=False, server_default=sa.text("''")))
    op.add_column("deploys", sa.Column("phases", TEXT, nullable=False, server_default=sa.text("'[]'")))


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
