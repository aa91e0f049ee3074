"""Make v9.sqlite and v9.json: a ledger as release e8de0c6 (schema version 9) writes it.

Run with that release's code first on the path and an empty state directory:

    git worktree add /tmp/rel-e8de0c6 e8de0c6
    PYTHONPATH=/tmp/rel-e8de0c6 ORCHESTRATOR_STATE_DIR="$(mktemp -d)" \\
        python3 tests/data/ledgers/make_v9.py [OUT_DIR]
    git worktree remove /tmp/rel-e8de0c6

Every row goes in through the old orchestrator/ledger.py's public functions (record_deploy,
record_bench, record_campaign, update_campaign, record_trial, record_adoption, update_adoption),
so the file is what that release writes. Every table gets at least two rows. Times are fixed:
record_deploy reads time.time() itself, so the ledger module's clock is a stand-in that returns
the time set before each deploy. The ledger is then checkpointed and vacuumed into one file
(OUT_DIR/v9.sqlite, OUT_DIR defaulting to this folder), and every row of every table is written to
OUT_DIR/v9.json as {table: [row, ...]}, rows in rowid order.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import orchestrator.ledger as ledger

HERE = Path(__file__).resolve().parent
#: The schema version the old release writes.
VERSION = 9
TABLES = ("deploys", "last_good", "good_units", "bench_results", "campaigns", "trials", "adoptions")
#: 2026-01-12 09:00:00 UTC: the first deploy.
T0 = 1768208400.0

MODEL = "/data/models/Kimi-K2.5"
DRAFT = "/data/eagle3/output_10k_sglang/4"
MODEL_DIGEST = "model:3f2a9c1d4e5b+draft:8b0e4f7a1c2d"
UNIT_NAME = "sglang.service"
PORT = 30000


class _Clock:
    """The ledger module's `time`: time() is the value set last; the rest is the real module's."""

    def __init__(self) -> None:
        self.now = T0
        self.monotonic = time.monotonic
        self.sleep = time.sleep

    def time(self) -> float:
        return self.now


def unit_text(profile: str, extra: str) -> str:
    """A systemd unit as the release renders one (shortened; its text only has to round-trip)."""
    return (
        "[Unit]\n"
        f"Description=SGLang server (orchestrator profile {profile})\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        'Environment="NCCL_PROTO=LL" "NCCL_ALGO=Ring" "NCCL_P2P_LEVEL=SYS"\n'
        f"ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path {MODEL} "
        f"--served-model-name kimi-k2.5 --tp-size 8 --host 0.0.0.0 --port {PORT} "
        f"--trust-remote-code{extra}\n"
        "Restart=on-failure\n"
        "TimeoutStopSec=120\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


EAGLE = f" --speculative-algorithm EAGLE3 --speculative-draft-model-path {DRAFT}"
UNITS = {
    "cg_5tok": unit_text(
        "cg_5tok",
        f"{EAGLE} --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 5",
    ),
    "cg_16tok": unit_text(
        "cg_16tok",
        f"{EAGLE} --speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16",
    ),
    "baseline": unit_text("baseline", ""),
}
DIGESTS = {name: digest(text) for name, text in UNITS.items()}


def facts(profile: str, speculative: bool = True) -> dict[str, Any]:
    """playvars.UnitFacts.model_dump() of a one-host, 8-GPU server."""
    return {
        "profile": profile,
        "port": PORT,
        "bind": "0.0.0.0",
        "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
        "health_url": f"http://127.0.0.1:{PORT}/health",
        "rank": 0,
        "nnodes": 1,
        "speculative": speculative,
        "model": MODEL,
        "adaptive_config": "",
    }


def phases(*seconds: float) -> list[dict[str, Any]]:
    names = (
        "launch",
        "init",
        "weights",
        "kv_cache",
        "jit",
        "graphs",
        "draft",
        "draft_graphs",
        "warmup",
        "ready",
    )
    return [{"phase": name, "s": s} for name, s in zip(names, seconds, strict=False)]


PREDICTED = {"weights_mib": 73421, "kv_tokens": 590000, "graph_mib": 3100}
MEASURED = {
    "weights_mib": 73420,
    "draft_weights_mib": 1210,
    "kv_tokens": 587687,
    "draft_kv_tokens": 587687,
    "graph_mib": 3054,
    "draft_graph_mib": 412,
    "baseline_mib": 80,
    "mem_fraction_static": 0.88,
}


def deploy(clock: _Clock, at: float, good: bool = True, **row: Any) -> None:
    clock.now = at
    profile = row["profile"]
    defaults = {"unit_name": UNIT_NAME, "digest": DIGESTS[profile], "model": MODEL}
    ledger.record_deploy(
        ledger.DeployRow(**{**defaults, **row}),
        good_unit=UNITS[profile] if good else None,
        facts=facts(profile, speculative=profile != "baseline") if good else None,
    )


def fill(clock: _Clock) -> None:
    # --- deploys, last_good, good_units -------------------------------------------------------
    full = phases(0.4, 11.2, 250.3, 18.6, 42.1, 61.8, 9.7, 38.4, 6.2, 0.5)
    memory = {"predicted": PREDICTED, "measured": MEASURED}
    for n, host in enumerate(("lab1", "lab2")):  # one run, two hosts, both healthy
        deploy(
            clock,
            T0 + 10 * n,
            run_id="a1b2c3d4e5f6",
            host=host,
            profile="cg_5tok",
            action="deploy",
            result="healthy",
            restarted=True,
            duration_s=441.2 + n,
            phases=full,
            model_digest=MODEL_DIGEST,
            memory=memory,
        )
    deploy(  # lab1 again: unit text unchanged, nothing restarted
        clock,
        T0 + 3600,
        run_id="0f1e2d3c4b5a",
        host="lab1",
        profile="cg_5tok",
        action="deploy",
        result="unchanged",
        restarted=False,
        duration_s=6.8,
    )
    deploy(  # lab1 to another profile: a second good unit of lab1
        clock,
        T0 + 7200,
        run_id="9a8b7c6d5e4f",
        host="lab1",
        profile="cg_16tok",
        action="deploy",
        result="healthy",
        restarted=True,
        duration_s=452.9,
        phases=phases(0.4, 10.9, 248.7, 18.1, 0.0, 63.0, 9.9, 41.2, 6.0, 0.5),
        model_digest=MODEL_DIGEST,
        memory={"predicted": PREDICTED, "measured": {**MEASURED, "kv_tokens": 571230, "graph_mib": 3310}},
    )
    deploy(  # lab2 to the baseline: out of memory on the KV cache
        clock,
        T0 + 10800,
        good=False,
        run_id="5e6f7a8b9c0d",
        host="lab2",
        profile="baseline",
        action="deploy",
        result="failed",
        restarted=True,
        duration_s=297.4,
        diagnosis=(
            "the server did not become healthy: torch.OutOfMemoryError: CUDA out of memory. "
            "Tried to allocate 2.00 GiB (GPU 3; 139.8 GiB total; 1.1 GiB free)"
        ),
        phases=phases(0.5, 11.0, 251.2, 34.7),
        model_digest=MODEL_DIGEST,
        memory={"predicted": {**PREDICTED, "graph_mib": None}},
    )
    deploy(  # ... and rolled back to its last known good
        clock,
        T0 + 11100,
        run_id="5e6f7a8b9c0d",
        host="lab2",
        profile="cg_5tok",
        action="rollback",
        result="healthy",
        restarted=True,
        duration_s=438.6,
        phases=full,
        model_digest=MODEL_DIGEST,
        memory=memory,
    )

    # --- bench_results --------------------------------------------------------------------------
    common = {
        "address": "10.0.0.11",
        "port": PORT,
        "sglang_version": "0.5.9",
        "git_commit": "e8de0c6",
        "endpoint": "generate",
        "requests": 64,
        "max_tokens": 512,
    }

    def bench(at: float, **row: Any) -> None:
        ledger.record_bench({**common, "time": at, **row})

    bench(  # closed loop, built-in prompts; model_digest left for record_bench to find (lab1's deploy)
        T0 + 900,
        run_id="b0000001a1b2",
        host="lab1",
        profile="cg_5tok",
        digest=DIGESTS["cg_5tok"],
        plan_digest=DIGESTS["cg_5tok"],
        speculative=1,
        result="ok",
        concurrency=1,
        output_tokens=32768,
        duration_s=398.5,
        tok_s=82.3,
        tok_s_p50=82.9,
        tok_s_min=71.4,
        tok_s_max=90.2,
        total_tok_s=82.2,
        ttft_mean_s=0.183,
        ttft_p50_s=0.171,
        ttft_p90_s=0.242,
        ttft_p99_s=0.318,
        itl_mean_s=0.01215,
        itl_p50_s=0.01198,
        itl_p90_s=0.01402,
        itl_p99_s=0.01733,
        accept_len=3.41,
        accept_len_log=3.38,
        accept_len_client=3.44,
        curve_id="c0ffee000001",
    )
    for repeat, (rate, tok_s) in enumerate(((2.0, 76.8), (4.0, 69.1))):  # open loop, a dataset, seeded
        bench(
            T0 + 1500 + 600 * repeat,
            run_id="b0000002c3d4",
            sweep_id="sw-20260112-a",
            host="lab2",
            address="10.0.0.12",
            profile="cg_5tok",
            digest=DIGESTS["cg_5tok"],
            speculative=1,
            result="ok",
            concurrency=8,
            output_tokens=31904 - 200 * repeat,
            duration_s=35.2 + 2.1 * repeat,
            tok_s=tok_s,
            tok_s_p50=tok_s + 0.4,
            tok_s_min=tok_s - 9.5,
            tok_s_max=tok_s + 8.1,
            total_tok_s=round(tok_s * 7.6, 1),
            ttft_mean_s=0.244,
            ttft_p50_s=0.229,
            ttft_p90_s=0.371,
            ttft_p99_s=0.512,
            itl_mean_s=0.0131,
            itl_p50_s=0.0128,
            itl_p90_s=0.0157,
            itl_p99_s=0.0201,
            accept_len=3.12,
            accept_len_log=3.09,
            endpoint="chat",
            dataset="chat_sharegpt",
            dataset_digest="4b1d0e2f9a7c6e53",
            request_rate=rate,
            temperature=0.7,
            seed=1234,
            curve_id="c0ffee000002",
            repeat=repeat,
            model_digest=MODEL_DIGEST,
            notes="open loop; Poisson arrivals",
        )
    bench(  # the baseline, no speculation, code prompts
        T0 + 7800,
        run_id="b0000003e5f6",
        host="lab1",
        profile="baseline",
        digest=DIGESTS["baseline"],
        result="ok",
        concurrency=4,
        output_tokens=32512,
        duration_s=92.1,
        tok_s=90.0,
        tok_s_p50=90.3,
        tok_s_min=86.7,
        tok_s_max=92.8,
        total_tok_s=353.0,
        ttft_mean_s=0.151,
        ttft_p50_s=0.148,
        ttft_p90_s=0.177,
        ttft_p99_s=0.209,
        itl_mean_s=0.0111,
        itl_p50_s=0.0110,
        itl_p90_s=0.0116,
        itl_p99_s=0.0124,
        dataset="code",
        dataset_digest="a93c5d10e7b24f68",
        seed=7,
        curve_id="c0ffee000003",
        model_digest=MODEL_DIGEST,
    )
    bench(  # a profile a sweep could not start: failed, metrics NULL
        T0 + 10900,
        run_id="b0000004a7b8",
        sweep_id="sw-20260112-b",
        host="lab2",
        address="10.0.0.12",
        port=None,
        profile="baseline",
        result="failed",
        diagnosis="deploy failed on lab2: CUDA out of memory (see `history lab2`)",
        concurrency=8,
        duration_s=None,
        tok_s=None,
        total_tok_s=None,
        curve_id="c0ffee000004",
    )

    # --- campaigns, trials (and their bench rows) ---------------------------------------------
    space = (
        "base: cg_5tok\n"
        "objective: tok_s\n"
        "vary:\n"
        "  speculative.num_steps: [2, 3, 4]\n"
        "  speculative.num_draft_tokens: [4, 5, 8]\n"
        "budget:\n"
        "  restarts: 6\n"
    )
    for n, (cid, hosts) in enumerate((("tune-20260113-a", ["lab1", "lab2"]), ("tune-20260114-b", ["lab1"]))):
        ledger.record_campaign(
            {
                "id": cid,
                "time": T0 + 86400 * (n + 1),
                "space_path": "/home/ops/spaces/eagle3.yml",
                "space_digest": hashlib.sha256(space.encode()).hexdigest()[:16],
                "space": space,
                "hosts": json.dumps(hosts),
                "status": "running",
            }
        )
    ledger.update_campaign("tune-20260114-b", status="interrupted")
    campaign_t = T0 + 86400

    def trial(at: float, **row: Any) -> None:
        ledger.record_trial({"campaign_id": "tune-20260113-a", "time": campaign_t + at, **row})

    base_point = json.dumps({}, separators=(",", ":"))
    for n, host in enumerate(("lab1", "lab2")):
        trial(
            600 + 60 * n,
            number=-1,
            kind="baseline",
            point=base_point,
            profile="cg_5tok",
            host=host,
            state="complete",
            value=1.0,
            curve_id=f"tc{n:010d}",
        )
    point = json.dumps({"speculative.num_draft_tokens": 8, "speculative.num_steps": 4}, separators=(",", ":"))
    trial(
        1800,
        number=0,
        kind="trial",
        point=point,
        profile="cg_5tok.3c9e1f",
        host="lab1",
        state="complete",
        value=1.063,
        curve_id="tc0000000002",
    )
    point2 = json.dumps(
        {"speculative.num_draft_tokens": 4, "speculative.num_steps": 2}, separators=(",", ":")
    )
    trial(
        3000,
        number=1,
        kind="trial",
        point=point2,
        profile="cg_5tok.7a0d42",
        host="lab2",
        state="complete",
        value=0.941,
        predicted=0.958,
        curve_id="tc0000000003",
    )
    trial(
        4200,
        number=2,
        kind="trial",
        point=point2,
        profile="cg_5tok.7a0d42",
        host="lab1",
        state="failed",
        value=None,
        predicted=1.012,
        diagnosis="deploy failed on lab1: health check timed out after 1800 s",
    )
    trial(
        5400,
        number=0,
        kind="confirm",
        point=point,
        profile="cg_5tok.3c9e1f",
        host="lab2",
        state="complete",
        value=1.051,
        restarted=0,
        curve_id="tc0000000004",
    )
    ledger.record_bench(
        {
            **common,
            "time": campaign_t + 1700,
            "run_id": "b0000005c9d0",
            "sweep_id": "tune-20260113-a",
            "host": "lab1",
            "profile": "cg_5tok.3c9e1f",
            "digest": "77aa0c3e5d19b2f4",
            "speculative": 1,
            "result": "ok",
            "concurrency": 1,
            "output_tokens": 32768,
            "duration_s": 374.9,
            "tok_s": 87.5,
            "total_tok_s": 87.4,
            "accept_len": 3.87,
            "curve_id": "tc0000000002",
            "model_digest": MODEL_DIGEST,
        }
    )
    ledger.update_campaign(
        "tune-20260113-a",
        status="done",
        outcome=json.dumps(
            {
                "verdict": "better",
                "winner": "cg_5tok.3c9e1f",
                "winner_file": "/home/ops/profiles/cg_5tok.3c9e1f.yml",
                "leaders": ["cg_5tok.3c9e1f"],
                "per_load": "concurrency 1: +6.3% (95% CI +4.1% to +8.4%)",
            }
        ),
    )

    # --- adoptions ------------------------------------------------------------------------------
    command = {
        "argv": [
            "/usr/bin/python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            MODEL,
            "--port",
            "30000",
            "--api-key",
            "<redacted>",
        ],
        "cwd": "/home/ops",
        "user": "ops",
        "log": "/home/ops/sglang.log",
        "digest": DIGESTS["cg_5tok"],
        "secrets": {"SGLANG_API_KEY": "<redacted>"},
    }
    for n, (host, pid, ticks) in enumerate((("lab1", 41872, 9120344), ("lab2", 39011, 8874112))):
        ledger.record_adoption(
            {
                "time": T0 + 172800 + 60 * n,
                "host": host,
                "unit_name": UNIT_NAME,
                "profile": "cg_5tok",
                "pid": pid,
                "start_ticks": ticks,
                "port": PORT,
                "command": json.dumps(command, sort_keys=True),
                "state": "pending",
            }
        )
    ledger.update_adoption(1, "taken")
    ledger.update_adoption(2, "relaunched")
    third = ledger.record_adoption(
        {
            "time": T0 + 259200,
            "host": "lab2",
            "unit_name": UNIT_NAME,
            "profile": "cg_5tok",
            "pid": 40555,
            "start_ticks": 9560021,
            "port": PORT,
            "command": json.dumps(command, sort_keys=True),
            "state": "pending",
        }
    )
    ledger.update_adoption(third, "gone")


def dump(db: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, in rowid order."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return {t: [dict(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY rowid")] for t in TABLES}
    finally:
        conn.close()


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    if len(ledger.MIGRATIONS) != VERSION:
        sys.exit(
            f"{ledger.__file__} knows {len(ledger.MIGRATIONS)} migrations, not {VERSION}: "
            "put release e8de0c6 first on PYTHONPATH"
        )
    db = ledger.path()
    if db.exists():
        sys.exit(f"{db} exists: set ORCHESTRATOR_STATE_DIR to an empty directory")
    clock = _Clock()
    ledger.time = clock  # type: ignore[assignment]
    fill(clock)
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    if version != VERSION:
        sys.exit(f"{db} has schema version {version}, not {VERSION}")
    rows = dump(db)
    if empty := [t for t, found in rows.items() if len(found) < 2]:
        sys.exit(f"tables with fewer than 2 rows: {', '.join(empty)}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(db, out / "v9.sqlite")
    (out / "v9.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    print(", ".join(f"{t} {len(found)}" for t, found in rows.items()))


if __name__ == "__main__":
    main()
