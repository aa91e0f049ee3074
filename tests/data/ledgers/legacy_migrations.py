"""The ledger's schema as release e8de0c6 made it: its MIGRATIONS, and ledgers of each older version.

MIGRATIONS is copied verbatim from that release's orchestrator/ledger.py (schema versions 1 to 9).
make_ledger(path, n) makes an empty ledger at version n the way that release's connect() did:
WAL journal, then each of the first n scripts run statement by statement (split on ";"), with
PRAGMA user_version set after each. Tests use it to prove a ledger of every older version migrates.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

MIGRATIONS = [
    """
    CREATE TABLE deploys (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL,
        action TEXT NOT NULL,          -- deploy, rollback
        result TEXT NOT NULL,          -- healthy, unchanged, failed
        restarted INTEGER NOT NULL,
        duration_s REAL NOT NULL,
        diagnosis TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX deploys_host_time ON deploys (host, time);
    CREATE TABLE last_good (
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL,
        unit TEXT NOT NULL,
        time REAL NOT NULL,
        PRIMARY KEY (host, unit_name)
    );
    CREATE TABLE good_units (
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL,
        unit TEXT NOT NULL,
        time REAL NOT NULL,
        PRIMARY KEY (host, unit_name, profile)
    );
    """,
    # 2: bench and sweep results. A row is one bench run, or one profile a sweep could not
    # start (result 'failed', metrics NULL, diagnosis set), so the ledger shows both.
    """
    CREATE TABLE bench_results (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        sweep_id TEXT NOT NULL DEFAULT '',
        time REAL NOT NULL,
        host TEXT NOT NULL,
        address TEXT NOT NULL DEFAULT '',
        port INTEGER,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL DEFAULT '',       -- of the unit that served the requests
        plan_digest TEXT NOT NULL DEFAULT '',  -- of --profile's plan, when given
        speculative INTEGER NOT NULL DEFAULT 0,
        sglang_version TEXT NOT NULL DEFAULT '',
        git_commit TEXT NOT NULL DEFAULT 'unknown',
        result TEXT NOT NULL,                  -- ok, failed
        diagnosis TEXT NOT NULL DEFAULT '',
        requests INTEGER NOT NULL DEFAULT 0,
        concurrency INTEGER NOT NULL DEFAULT 0,
        max_tokens INTEGER NOT NULL DEFAULT 0,
        errors INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        duration_s REAL,
        tok_s REAL,                            -- mean per-request decode speed
        tok_s_p50 REAL,
        tok_s_min REAL,
        tok_s_max REAL,
        total_tok_s REAL,                      -- all output tokens over the measured wall time
        ttft_mean_s REAL,
        ttft_p50_s REAL,
        ttft_p90_s REAL,
        ttft_p99_s REAL,
        itl_mean_s REAL,
        itl_p50_s REAL,
        itl_p90_s REAL,
        itl_p99_s REAL,
        accept_len REAL,                       -- /get_server_info internal_states
        accept_len_log REAL,                   -- mean of the server log's `accept len` lines
        accept_len_client REAL,                -- completion tokens over spec_verify_ct
        notes TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX bench_profile_time ON bench_results (profile, time)
    """,
    # 3: what a good unit means (playvars.UnitFacts as JSON: port, bind, GPUs, health URL, rank),
    # kept with it so a rollback never reads them back out of the unit text. Rows recorded
    # before this keep '{}': rolling back to one of them says so.
    """
    ALTER TABLE last_good ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE good_units ADD COLUMN facts TEXT NOT NULL DEFAULT '{}'
    """,
    # 4: the traffic a bench row measured (endpoint, dataset, load, sampling), so results compare
    # like with like; one bench or sweep run's levels and repeats share a curve_id. Rows from
    # before keep generate, the built-in prompts ('' dataset), temperature 0, closed loop.
    """
    ALTER TABLE bench_results ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'generate';
    ALTER TABLE bench_results ADD COLUMN dataset TEXT NOT NULL DEFAULT '';
    ALTER TABLE bench_results ADD COLUMN dataset_digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE bench_results ADD COLUMN request_rate REAL;
    ALTER TABLE bench_results ADD COLUMN temperature REAL NOT NULL DEFAULT 0;
    ALTER TABLE bench_results ADD COLUMN seed INTEGER;
    ALTER TABLE bench_results ADD COLUMN curve_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE bench_results ADD COLUMN repeat INTEGER NOT NULL DEFAULT 0
    """,
    # 5: tuning campaigns (tune): the space file as read, its hosts and lock, and each trial
    # that finished (a baseline per host, a point of the space, or a leader's extra runs); the
    # trials' bench runs are bench_results rows whose sweep_id is the campaign's id.
    """
    CREATE TABLE campaigns (
        id TEXT PRIMARY KEY,
        time REAL NOT NULL,
        space_path TEXT NOT NULL,
        space_digest TEXT NOT NULL,
        space TEXT NOT NULL,
        hosts TEXT NOT NULL,                   -- JSON list of host names
        status TEXT NOT NULL,                  -- running, interrupted, done
        outcome TEXT NOT NULL DEFAULT '{}'     -- JSON: the verdict and the winner
    );
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        campaign_id TEXT NOT NULL,
        time REAL NOT NULL,
        number INTEGER NOT NULL,               -- the search's trial number (-1: a baseline)
        kind TEXT NOT NULL,                    -- baseline, trial, confirm
        point TEXT NOT NULL,                   -- JSON of the varied fields' values
        profile TEXT NOT NULL,
        host TEXT NOT NULL,
        state TEXT NOT NULL,                   -- complete, stopped, failed, infeasible
        value REAL,                            -- the objective as a ratio to the host's baseline
        restarted INTEGER NOT NULL DEFAULT 1,
        diagnosis TEXT NOT NULL DEFAULT '',
        curve_id TEXT NOT NULL DEFAULT ''      -- its bench_results rows' curve_id
    );
    CREATE INDEX trials_campaign ON trials (campaign_id, id)
    """,
    """
    ALTER TABLE deploys ADD COLUMN model TEXT NOT NULL DEFAULT '';      -- the target model's path
    ALTER TABLE deploys ADD COLUMN phases TEXT NOT NULL DEFAULT '[]';   -- JSON [{phase, s}] of the start
    """,
    # 7: what the campaign's model predicted for a trial before it was measured (its error is
    # reported); NULL for a trial the model did not choose.
    """
    ALTER TABLE trials ADD COLUMN predicted REAL
    """,
    # 8: the files a start read (the model's and drafter's digests), so that results never mix two
    # checkpoints; and its GPU memory, predicted before the stop and measured from the server's log.
    """
    ALTER TABLE deploys ADD COLUMN model_digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE deploys ADD COLUMN memory TEXT NOT NULL DEFAULT '{}';   -- JSON {predicted, measured}
    ALTER TABLE bench_results ADD COLUMN model_digest TEXT NOT NULL DEFAULT ''
    """,
    # 9: servers started by hand that `adopt` wrote a profile for: the next deploy of that unit on
    # that host stops the process (known by PID and start time) and starts the unit.
    """
    CREATE TABLE adoptions (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        pid INTEGER NOT NULL,
        start_ticks INTEGER NOT NULL,          -- /proc/PID/stat field 22: the PID's identity
        port INTEGER NOT NULL,
        command TEXT NOT NULL DEFAULT '{}',    -- JSON {argv, cwd, user, log}, secrets redacted
        state TEXT NOT NULL                    -- pending, taken, relaunched, gone
    );
    CREATE INDEX adoptions_host ON adoptions (host, unit_name, id)
    """,
]


def make_ledger(path: Path | str, version: int) -> Path:
    """A new ledger file at `path`, at the schema of the first `version` migrations (0 to 9), its
    PRAGMA user_version `version`, and no rows. An existing file is refused."""
    if not 0 <= version <= len(MIGRATIONS):
        raise ValueError(f"version {version}: release e8de0c6 knows versions 0 to {len(MIGRATIONS)}")
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        for number, script in enumerate(MIGRATIONS[:version], start=1):
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={number}")
        conn.execute("COMMIT")
    finally:
        conn.close()
    return path
