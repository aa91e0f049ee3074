"""9: servers started by hand that `adopt` wrote a profile for. The next deploy of that unit on
that host stops the process (known by PID and start time) and starts the unit."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import INT, REAL, TEXT

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "adoptions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("time", REAL, nullable=False),
        sa.Column("host", TEXT, nullable=False),
        sa.Column("unit_name", TEXT, nullable=False),
        sa.Column("profile", TEXT, nullable=False),
        sa.Column("pid", INT, nullable=False),
        sa.Column("start_ticks", INT, nullable=False),
        sa.Column("port", INT, nullable=False),
        sa.Column("command", TEXT, nullable=False, server_default=sa.text("'{}'")),
        sa.Column("state", TEXT, nullable=False),
    )
    op.create_index("adoptions_host", "adoptions", ["host", "unit_name", "id"])


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
