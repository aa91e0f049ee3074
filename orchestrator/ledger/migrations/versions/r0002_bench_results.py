"""2: bench and sweep results. A row is one bench run, or one profile a sweep could not start
(result 'failed', metrics NULL, diagnosis set), so the ledger shows both."""

import sqlalchemy as sa
from alembic import op

from orchestrator.ledger.schema import INT, REAL, TEXT

revision = "0002"
down_revision = "0001"

METRICS = (
    "duration_s",
    "tok_s",
    "tok_s_p50",
    "tok_s_min",
    "tok_s_max",
    "total_tok_s",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_mean_s",
    "itl_p50_s",
    "itl_p90_s",
    "itl_p99_s",
    "accept_len",
    "accept_len_log",
    "accept_len_client",
)


def _text(name: str, default: str | None = None) -> sa.Column[str]:
    return sa.Column(name, TEXT, nullable=False, server_default=None if default is None else sa.text(default))


def _count(name: str) -> sa.Column[int]:
    return sa.Column(name, INT, nullable=False, server_default=sa.text("0"))


def upgrade() -> None:
    op.create_table(
        "bench_results",
        sa.Column("id", sa.Integer, primary_key=True),
        _text("run_id"),
        _text("sweep_id", "''"),
        sa.Column("time", REAL, nullable=False),
        _text("host"),
        _text("address", "''"),
        sa.Column("port", INT),
        _text("profile"),
        _text("digest", "''"),
        _text("plan_digest", "''"),
        _count("speculative"),
        _text("sglang_version", "''"),
        _text("git_commit", "'unknown'"),
        _text("result"),
        _text("diagnosis", "''"),
        *map(_count, ("requests", "concurrency", "max_tokens", "errors", "output_tokens")),
        *(sa.Column(name, REAL) for name in METRICS),
        _text("notes", "''"),
    )
    op.create_index("bench_profile_time", "bench_results", ["profile", "time"])


def downgrade() -> None:
    raise NotImplementedError("the ledger only moves forward")
