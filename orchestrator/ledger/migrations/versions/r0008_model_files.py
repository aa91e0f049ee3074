"""8: the files a start read (the model's and drafter's digests), so results never mix two
checkpoints; and its GPU memory, predicted before the stop and measured from the server's log."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import TEXT

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.add_column("deploys", sa.Column("model_digest", TEXT, nullable=False, server_default=sa.text("''")))
    op.add_column("deploys", sa.Column("memory", TEXT, nullable=False, server_default=sa.text("'{}'")))
    op.add_column(
        "bench_results", sa.Column("model_digest", TEXT, nullable=False, server_default=sa.text("''"))
    )


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
