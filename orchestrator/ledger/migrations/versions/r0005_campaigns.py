"""5: tuning campaigns (tune): the space file as read, its hosts, and each trial that finished (a
baseline per host, a point of the space, or a leader's extra runs). A trial's bench runs are
bench_results rows whose sweep_id is the campaign's id."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import INT, REAL, TEXT

revision = "0005"
down_revision = "0004"


def _text(name: str, default: str | None = None) -> sa.Column[str]:
    return sa.Column(name, TEXT, nullable=False, server_default=None if default is None else sa.text(default))


def upgrade() -> None:
    op.create_table(
        "campaigns",
        sa.Column("id", TEXT, primary_key=True),
        sa.Column("time", REAL, nullable=False),
        _text("space_path"),
        _text("space_digest"),
        _text("space"),
        _text("hosts"),
        _text("status"),
        _text("outcome", "'{}'"),
    )
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True),
        _text("campaign_id"),
        sa.Column("time", REAL, nullable=False),
        sa.Column("number", INT, nullable=False),
        _text("kind"),
        _text("point"),
        _text("profile"),
        _text("host"),
        _text("state"),
        sa.Column("value", REAL),
        sa.Column("restarted", INT, nullable=False, server_default=sa.text("1")),
        _text("diagnosis", "''"),
        _text("curve_id", "''"),
    )
    op.create_index("trials_campaign", "trials", ["campaign_id", "id"])


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
