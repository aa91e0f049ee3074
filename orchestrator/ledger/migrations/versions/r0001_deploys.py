"""1: deploys, and the good units of each host (the last one, and one per profile)."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import INT, REAL, TEXT

revision = "0001"
down_revision = None


def _text(name: str, default: str | None = None) -> sa.Column[str]:
    return sa.Column(name, TEXT, nullable=False, server_default=None if default is None else sa.text(default))


def upgrade() -> None:
    op.create_table(
        "deploys",
        sa.Column("id", sa.Integer, primary_key=True),
        _text("run_id"),
        sa.Column("time", REAL, nullable=False),
        _text("host"),
        _text("unit_name"),
        _text("profile"),
        _text("digest"),
        _text("action"),
        _text("result"),
        sa.Column("restarted", INT, nullable=False),
        sa.Column("duration_s", REAL, nullable=False),
        _text("diagnosis", "''"),
    )
    op.create_index("deploys_host_time", "deploys", ["host", "time"])
    for name, key in (("last_good", ["host", "unit_name"]), ("good_units", ["host", "unit_name", "profile"])):
        op.create_table(
            name,
            _text("host"),
            _text("unit_name"),
            _text("profile"),
            _text("digest"),
            _text("unit"),
            sa.Column("time", REAL, nullable=False),
            sa.PrimaryKeyConstraint(*key),
        )


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
