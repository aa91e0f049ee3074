"""The ledger's tables as the newest migration leaves them (SQLAlchemy Core).

The migrations (migrations/versions/) make them; tests/unit/test_ledger_engines.py checks that both
agree, on SQLite and on PostgreSQL. Readers take each column's type, NOT NULL and default from here.

Numbers: INT is 64-bit on PostgreSQL (a PID's start time in clock ticks outgrows 32 bits), REAL is
double precision there (a time since 1970 needs it). On SQLite both keep the names SQLite ledgers
have always had.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

#: The newest schema version: the number of the last migration.
HEAD = 11

INT = sa.BigInteger().with_variant(sqlite.INTEGER(), "sqlite")
REAL = sa.Float(precision=53).with_variant(sqlite.REAL(), "sqlite")
TEXT = sa.Text()

metadata = sa.MetaData()


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.Integer, primary_key=True, autoincrement=True)


def _text(name: str, default: str | None = None) -> sa.Column[str]:
    """A NOT NULL text column; with a default when given."""
    server_default = None if default is None else sa.text(f"'{default}'")
    return sa.Column(name, TEXT, nullable=False, server_default=server_default)


def _team() -> list[sa.Column[str]]:
    """Migration 10: the control machine that wrote a row, and the row a push copied it from."""
    return [_text("origin", ""), sa.Column("pushed_from", TEXT)]


deploys = sa.Table(
    "deploys",
    metadata,
    _id(),
    _text("run_id"),
    sa.Column("time", REAL, nullable=False),
    _text("host"),
    _text("unit_name"),
    _text("profile"),
    _text("digest"),
    _text("action"),  # deploy, rollback
    _text("result"),  # healthy, unchanged, failed
    sa.Column("restarted", INT, nullable=False),
    sa.Column("duration_s", REAL, nullable=False),
    _text("diagnosis", ""),
    _text("model", ""),
    _text("phases", "[]"),
    _text("model_digest", ""),
    _text("memory", "{}"),
    *_team(),
    sa.Index("deploys_host_time", "host", "time"),
    sa.Index("deploys_pushed_from", "pushed_from", unique=True),
)


def _good_table(name: str, *key: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        _text("host"),
        _text("unit_name"),
        _text("profile"),
        _text("digest"),
        _text("unit"),
        sa.Column("time", REAL, nullable=False),
        _text("facts", "{}"),
        _text("origin", ""),
        sa.PrimaryKeyConstraint(*key),
    )


last_good = _good_table("last_good", "host", "unit_name")
good_units = _good_table("good_units", "host", "unit_name", "profile")

bench_results = sa.Table(
    "bench_results",
    metadata,
    _id(),
    _text("run_id"),
    _text("sweep_id", ""),
    sa.Column("time", REAL, nullable=False),
    _text("host"),
    _text("address", ""),
    sa.Column("port", INT),
    _text("profile"),
    _text("digest", ""),
    _text("plan_digest", ""),
    sa.Column("speculative", INT, nullable=False, server_default=sa.text("0")),
    _text("sglang_version", ""),
    _text("git_commit", "unknown"),
    _text("result"),
    _text("diagnosis", ""),
    *[
        sa.Column(name, INT, nullable=False, server_default=sa.text("0"))
        for name in ("requests", "concurrency", "max_tokens", "errors", "output_tokens")
    ],
    *[
        sa.Column(name, REAL)
        for name in (
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
    ],
    _text("notes", ""),
    _text("endpoint", "generate"),
    _text("dataset", ""),
    _text("dataset_digest", ""),
    sa.Column("request_rate", REAL),
    sa.Column("temperature", REAL, nullable=False, server_default=sa.text("0")),
    sa.Column("seed", INT),
    _text("curve_id", ""),
    sa.Column("repeat", INT, nullable=False, server_default=sa.text("0")),
    _text("model_digest", ""),
    *_team(),
    # Migration 11: a bench through a PD gateway names the fleet it ran on (JSON; "": one server).
    _text("fleet", ""),
    sa.Index("bench_profile_time", "profile", "time"),
    sa.Index("bench_sweep", "sweep_id"),
    sa.Index("bench_results_pushed_from", "pushed_from", unique=True),
)

campaigns = sa.Table(
    "campaigns",
    metadata,
    sa.Column("id", TEXT, primary_key=True),
    sa.Column("time", REAL, nullable=False),
    _text("space_path"),
    _text("space_digest"),
    _text("space"),
    _text("hosts"),  # JSON list of host names
    _text("status"),  # running, interrupted, done, failed
    _text("outcome", "{}"),  # JSON: the verdict and the winner
    _text("origin", ""),
    # Who runs it now ("" when nobody): user@machine pid N; heartbeat: when it last said so.
    _text("holder", ""),
    sa.Column("heartbeat", REAL),
)

trials = sa.Table(
    "trials",
    metadata,
    _id(),
    _text("campaign_id"),
    sa.Column("time", REAL, nullable=False),
    sa.Column("number", INT, nullable=False),  # the search's trial number (-1: a baseline)
    _text("kind"),  # baseline, trial, confirm
    _text("point"),  # JSON of the varied fields' values
    _text("profile"),
    _text("host"),
    _text("state"),  # complete, stopped, failed, infeasible
    sa.Column("value", REAL),  # the objective as a ratio to the host's baseline
    sa.Column("restarted", INT, nullable=False, server_default=sa.text("1")),
    _text("diagnosis", ""),
    _text("curve_id", ""),
    sa.Column("predicted", REAL),
    *_team(),
    sa.Index("trials_campaign", "campaign_id", "id"),
    sa.Index("trials_pushed_from", "pushed_from", unique=True),
)

adoptions = sa.Table(
    "adoptions",
    metadata,
    _id(),
    sa.Column("time", REAL, nullable=False),
    _text("host"),
    _text("unit_name"),
    _text("profile"),
    sa.Column("pid", INT, nullable=False),
    sa.Column("start_ticks", INT, nullable=False),  # /proc/PID/stat field 22: the PID's identity
    sa.Column("port", INT, nullable=False),
    _text("command", "{}"),  # JSON {argv, cwd, user, log}, secrets redacted
    _text("state"),  # pending, taken, relaunched, gone
    *_team(),
    sa.Index("adoptions_host", "host", "unit_name", "id"),
    sa.Index("adoptions_pushed_from", "pushed_from", unique=True),
)

#: One row per fact about the ledger itself: its id (ledger_id), and when each control machine
#: last wrote (seen:MACHINE).
ledger_info = sa.Table(
    "ledger_info",
    metadata,
    sa.Column("key", TEXT, primary_key=True),
    _text("value"),
)

#: Tables whose rows a push copies once each (by pushed_from): the ones with an id.
LOGGED = ("deploys", "bench_results", "trials", "adoptions")
