"""7: what the campaign's model predicted for a trial before it was measured (its error is
reported); NULL for a trial the model did not choose."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import REAL

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.add_column("trials", sa.Column("predicted", REAL))


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
