"""4: the traffic a bench row measured (endpoint, dataset, load, sampling), so results compare like
with like; one run's levels and repeats share a curve_id. Older rows keep generate, the built-in
prompts ('' dataset), temperature 0, closed loop."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import INT, REAL, TEXT

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    for column in (
        sa.Column("endpoint", TEXT, nullable=False, server_default=sa.text("'generate'")),
        sa.Column("dataset", TEXT, nullable=False, server_default=sa.text("''")),
        sa.Column("dataset_digest", TEXT, nullable=False, server_default=sa.text("''")),
        sa.Column("request_rate", REAL),
        sa.Column("temperature", REAL, nullable=False, server_default=sa.text("0")),
        sa.Column("seed", INT),
        sa.Column("curve_id", TEXT, nullable=False, server_default=sa.text("''")),
        sa.Column("repeat", INT, nullable=False, server_default=sa.text("0")),
    ):
        op.add_column("bench_results", column)


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
