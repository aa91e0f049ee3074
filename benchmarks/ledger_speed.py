"""The ledger at a team's size (issue #43), on SQLite and on PostgreSQL (loopback), side by side.

1. Fills a SQLite ledger with 100,000 bench rows and 10,000 deploys (20 hosts, 30 profiles, a few
   datasets, 200 campaigns of 50 trials whose bench rows carry the campaign's id as sweep_id, and
   bench runs outside any campaign), then `ledger push`es it into a fresh PostgreSQL database:
   the push is timed too.
2. Times, as a user runs them, `history`, `history --host H`, `results`, `results --format csv`,
   `results --profile P` and `ledger status` on each, with `--help` as the baseline of one run;
   and, in-process, what a campaign's resume reads: ledger.campaign(id), ledger.trials(id),
   ledger.bench_results(sweep_id=id) (and those three in a fresh process, connecting included), and
   ledger.bench_results() (every row: what `results` and tune's estimate read).
3. Two processes write a campaign each (its row, then trials and bench rows interleaved) at the
   same time into one PostgreSQL database, then into one SQLite file: rows written, found, lost.

Starts its own PostgreSQL (tests/pg.py, with fsync on) and removes it and every ledger it made at
the end. Prints numbers; asserts nothing. The times are medians of --repeat runs (a command slower
than --slow seconds runs once); machines are noisy, so compare the ratios (PostgreSQL to SQLite,
each to `--help`), not the seconds. The default sizes take about 15 minutes on 2 cores, most of it
`results` printing 100,000 rows and the push; --quick takes about 15 seconds.

Usage: python3 benchmarks/ledger_speed.py [--rows 100000] [--deploys 10000] [--repeat 5] [--slow 60]
       [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlalchemy as sa

from orchestrator import ledger
from orchestrator.ledger import schema, store, team

REPO = Path(__file__).resolve().parents[1]
HOSTS = [f"gpu-{i:02d}" for i in range(1, 21)]
PROFILES = ["baseline", *[f"tune-{i:02d}" for i in range(1, 30)]]
DATASETS = [
    ("", ""),  # random prompts: no dataset
    ("sharegpt", hashlib.sha256(b"sharegpt").hexdigest()),
    ("longbench", hashlib.sha256(b"longbench").hexdigest()),
    ("code-review", hashlib.sha256(b"code-review").hexdigest()),
]
LEVELS = (1, 4, 16, 64)  # concurrency
TRIALS = 50  # per campaign
YEAR_S = 365 * 86400.0
COLUMNS = "120"  # the width the commands print at (their output goes to a file, not a terminal)
#: The commands a --quick run times: one of each kind (each start of the CLI costs about a second).
QUICK_COMMANDS = ("--help (baseline)", "history", f"results --profile {PROFILES[7]}", "ledger status")
#: PostgreSQL as a team runs it: durable commits, the server's default cache (tests/pg.py turns
#: both down for speed).
PG_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "shared_buffers": "128MB"}


@dataclass(frozen=True)
class Sizes:
    rows: int  # bench rows
    deploys: int
    campaigns: int
    trials: int  # per campaign
    race_trials: int  # per writer process
    race_bench: int  # bench rows per trial, per writer process
    repeat: int
    quick: bool = False


def sizes(args: argparse.Namespace) -> Sizes:
    if args.quick:
        rows, deploys, repeat = args.rows or 400, args.deploys or 100, args.repeat or 1
        return Sizes(rows, deploys, max(2, rows // 500), 10, 5, 4, repeat, quick=True)
    rows, deploys, repeat = args.rows or 100_000, args.deploys or 10_000, args.repeat or 5
    return Sizes(rows, deploys, max(2, rows // 500), TRIALS, 50, 10, repeat)


# --- the ledger's rows ----------------------------------------------------------------------------


def _hex(rng: random.Random, n: int = 12) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:16]


def _unit(host: str, profile: str) -> str:
    """A unit file's text, about as long as a real one."""
    return (
        "[Unit]\nDescription=SGLang server (orchestrator)\nAfter=network-online.target\n\n"
        "[Service]\nUser=sglang\nEnvironment=CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_CUMEM_ENABLE=0\n"
        f"ExecStart=/opt/sglang/bin/python -m sglang.launch_server --host 0.0.0.0 --port 30000 "
        f"--model-path /models/Llama-3.1-70B-Instruct --tp 8 --mem-fraction-static 0.85 "
        f"--cuda-graph-max-bs 160 --speculative-algorithm EAGLE3 --speculative-num-steps 3 "
        f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --served-model-name {profile} "
        f"--log-level info --enable-metrics\n# host {host}\nRestart=on-failure\nTimeoutStartSec=1800\n"
        "LimitNOFILE=1048576\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def _bench_row(
    rng: random.Random,
    t: float,
    host: str,
    profile: str,
    sweep_id: str,
    curve_id: str,
    concurrency: int,
    repeat: int,
    dataset: tuple[str, str],
) -> dict[str, Any]:
    ok = rng.random() > 0.02
    tok = rng.uniform(30.0, 400.0) / (1 + concurrency / 32) if ok else None
    speculative = profile != "baseline"
    requests = 200
    ttft, itl = rng.uniform(0.05, 2.0), rng.uniform(0.004, 0.03)

    def spread(x: float | None, lo: float, hi: float) -> float | None:
        return None if x is None else x * rng.uniform(lo, hi)

    return {
        "run_id": _hex(rng),
        "sweep_id": sweep_id,
        "time": t,
        "host": host,
        "address": f"10.0.{HOSTS.index(host) // 8}.{HOSTS.index(host) + 10}",
        "port": 30000,
        "profile": profile,
        "digest": _digest(host, profile),
        "plan_digest": _digest("plan", host, profile),
        "speculative": int(speculative),
        "sglang_version": "0.5.9",
        "git_commit": "3f9c2ab",
        "result": "ok" if ok else "failed",
        "diagnosis": "" if ok else "server returned 503 on 12 of 200 requests; see the server log",
        "requests": requests,
        "concurrency": concurrency,
        "max_tokens": 256,
        "errors": 0 if ok else 12,
        "output_tokens": requests * 256 if ok else 0,
        "duration_s": rng.uniform(20.0, 240.0),
        "tok_s": tok,
        "tok_s_p50": spread(tok, 0.95, 1.05),
        "tok_s_min": spread(tok, 0.5, 0.9),
        "tok_s_max": spread(tok, 1.1, 1.5),
        "total_tok_s": None if tok is None else tok * concurrency,
        "ttft_mean_s": ttft,
        "ttft_p50_s": ttft * 0.9,
        "ttft_p90_s": ttft * 1.6,
        "ttft_p99_s": ttft * 2.5,
        "itl_mean_s": itl,
        "itl_p50_s": itl * 0.95,
        "itl_p90_s": itl * 1.4,
        "itl_p99_s": itl * 2.2,
        "accept_len": rng.uniform(1.5, 3.5) if speculative else None,
        "accept_len_log": rng.uniform(1.5, 3.5) if speculative else None,
        "accept_len_client": rng.uniform(1.5, 3.5) if speculative else None,
        "notes": "",
        "endpoint": "generate" if rng.random() < 0.8 else "chat",
        "dataset": dataset[0],
        "dataset_digest": dataset[1],
        "request_rate": None,
        "temperature": 0.0,
        "seed": 1 if dataset[0] else None,
        "curve_id": curve_id,
        "repeat": repeat,
        "model_digest": _digest("model", "Llama-3.1-70B-Instruct"),
        "fleet": "",  # one server benched, not a PD fleet through its gateway
        "origin": f"ctl-{HOSTS.index(host) % 3}",
    }


def _campaign_row(rng: random.Random, cid: str, t: float, hosts: list[str]) -> dict[str, Any]:
    space = (
        "# a tuning space\nbase: baseline\nhosts: " + json.dumps(hosts) + "\n"
        "vary:\n  cuda_graph_max_bs: [64, 96, 128, 160, 192]\n  speculative_num_steps: [2, 3, 4, 5]\n"
        "  speculative_num_draft_tokens: [4, 8, 16]\n  mem_fraction_static: [0.8, 0.85, 0.9]\n"
        "traffic:\n  concurrency: [1, 4, 16, 64]\n  requests: 200\n  max_tokens: 256\n"
        "budget:\n  restarts: 50\nobjective: tok_s\n"
    )
    outcome = {
        "verdict": "faster",
        "winner": {"profile": rng.choice(PROFILES), "speedup": rng.uniform(1, 1.4)},
    }
    return {
        "id": cid,
        "time": t,
        "space_path": f"/home/ops/spaces/space-{cid[:4]}.yml",
        "space_digest": _digest("space", cid),
        "space": space,
        "hosts": json.dumps(hosts),
        "status": rng.choice(["done", "done", "done", "interrupted"]),
        "outcome": json.dumps(outcome),
        "origin": "ctl-0",
        "holder": "",
        "heartbeat": None,
    }


def _trial_row(
    rng: random.Random, cid: str, number: int, t: float, host: str, profile: str, curve_id: str
) -> dict[str, Any]:
    point = {
        "cuda_graph_max_bs": rng.choice([64, 96, 128, 160, 192]),
        "mem_fraction_static": str(rng.choice(["0.8", "0.85", "0.9"])),
        "speculative_num_draft_tokens": rng.choice([4, 8, 16]),
        "speculative_num_steps": rng.choice([2, 3, 4, 5]),
    }
    return {
        "campaign_id": cid,
        "time": t,
        "number": number,
        "kind": "baseline" if number < 0 else ("confirm" if number >= TRIALS - 3 else "trial"),
        "point": json.dumps(point, sort_keys=True, separators=(",", ":")),
        "profile": profile,
        "host": host,
        "state": rng.choice(["complete"] * 8 + ["failed", "infeasible"]),
        "value": rng.uniform(0.8, 1.4),
        "restarted": 1,
        "diagnosis": "",
        "curve_id": curve_id,
        "predicted": rng.uniform(0.9, 1.3) if number >= 0 else None,
        "origin": "ctl-0",
        "pushed_from": None,
    }


def _deploy_row(rng: random.Random, t: float) -> dict[str, Any]:
    host, profile = rng.choice(HOSTS), rng.choice(PROFILES)
    result = rng.choice(["healthy"] * 6 + ["unchanged"] * 3 + ["failed"])
    restarted = result != "unchanged"
    phases = (
        [
            {"phase": "stop", "s": rng.uniform(1, 5)},
            {"phase": "weights", "s": rng.uniform(20, 90)},
            {"phase": "cuda_graph", "s": rng.uniform(10, 60)},
            {"phase": "warmup", "s": rng.uniform(2, 10)},
        ]
        if restarted
        else []
    )
    memory = (
        {"predicted": {"gib": 71.2}, "measured": {"gib": rng.uniform(65, 75)}} if result == "healthy" else {}
    )
    return {
        "run_id": _hex(rng),
        "time": t,
        "host": host,
        "unit_name": "sglang",
        "profile": profile,
        "digest": _digest(host, profile),
        "action": "rollback" if rng.random() < 0.05 else "deploy",
        "result": result,
        "restarted": int(restarted),
        "duration_s": sum(p["s"] for p in phases) + rng.uniform(3, 8),
        "diagnosis": "" if result != "failed" else "CUDA out of memory while capturing graphs (bs 160)",
        "model": "Llama-3.1-70B-Instruct",
        "phases": json.dumps(phases),
        "model_digest": _digest("model", "Llama-3.1-70B-Instruct") if result == "healthy" else "",
        "memory": json.dumps(memory),
        "origin": f"ctl-{HOSTS.index(host) % 3}",
        "pushed_from": None,
    }


def _good_row(host: str, profile: str, t: float) -> dict[str, Any]:
    facts = {"gpus": 8, "gpu": "H100 80GB HBM3", "driver": "550.90.07", "sglang": "0.5.9"}
    return {
        "host": host,
        "unit_name": "sglang",
        "profile": profile,
        "digest": _digest(host, profile),
        "unit": _unit(host, profile),
        "time": t,
        "facts": json.dumps(facts),
        "origin": "ctl-0",
    }


@dataclass
class Filled:
    """The ledger's rows per table, and what the benchmark asks about."""

    tables: dict[str, list[dict[str, Any]]]
    campaigns: list[str]
    per_campaign: int  # bench rows


def rows_of(n: Sizes, now: float, seed: int = 43) -> Filled:
    """Every table's rows: campaigns with their trials and bench rows, bench runs of no campaign,
    deploys, good units and adoptions, spread over the year before `now`."""
    rng = random.Random(seed)
    start = now - YEAR_S
    per_trial = max(1, (n.rows * 9 // 10) // (n.campaigns * n.trials))
    lone = max(0, n.rows - per_trial * n.campaigns * n.trials)  # bench runs outside campaigns
    bench: list[dict[str, Any]] = []
    trials: list[dict[str, Any]] = []
    campaigns: list[dict[str, Any]] = []
    step = YEAR_S / n.campaigns
    for c in range(n.campaigns):
        cid = uuid.UUID(int=rng.getrandbits(128)).hex[:12]
        t = start + c * step
        hosts = rng.sample(HOSTS, rng.randint(2, 4))
        campaigns.append(_campaign_row(rng, cid, t, hosts))
        for k in range(n.trials):
            host = hosts[k % len(hosts)]
            profile = "baseline" if k < len(hosts) else rng.choice(PROFILES[1:])
            number = -1 if k < len(hosts) else k - len(hosts)
            curve = _hex(rng)
            t += rng.uniform(600, step / (n.trials + 1))
            dataset = DATASETS[c % len(DATASETS)]
            for j in range(per_trial):
                concurrency, repeat = LEVELS[j % len(LEVELS)], j // len(LEVELS)
                row = _bench_row(rng, t + 60 * j, host, profile, cid, curve, concurrency, repeat, dataset)
                bench.append(row)
            trials.append(_trial_row(rng, cid, number, t + 60 * per_trial, host, profile, curve))
    for _ in range(lone):
        host, profile = rng.choice(HOSTS), rng.choice(PROFILES)
        sweep = "" if rng.random() < 0.5 else f"sweep-{rng.randrange(500):03d}"
        t = rng.uniform(start, now)
        row = _bench_row(rng, t, host, profile, sweep, "", rng.choice(LEVELS), 0, rng.choice(DATASETS))
        bench.append(row | {"curve_id": row["run_id"]})
    bench.sort(key=lambda r: r["time"])
    for row in bench:
        row["pushed_from"] = None
    deploys = sorted(
        (_deploy_row(rng, rng.uniform(start, now)) for _ in range(n.deploys)), key=lambda r: r["time"]
    )
    good = [_good_row(h, p, rng.uniform(start, now)) for h in HOSTS for p in rng.sample(PROFILES, 10)]
    last = {}
    for g in sorted(good, key=lambda r: r["time"]):
        last[g["host"]] = g
    adoptions = [
        {
            "time": rng.uniform(start, now),
            "host": h,
            "unit_name": "sglang",
            "profile": f"adopted-{h}",
            "pid": rng.randint(1000, 99999),
            "start_ticks": rng.randint(10**6, 10**10),
            "port": 30000,
            "command": json.dumps(
                {"argv": ["python3", "-m", "sglang.launch_server"], "cwd": "/", "user": "ops"}
            ),
            "state": "taken",
            "origin": "ctl-0",
            "pushed_from": None,
        }
        for h in HOSTS
    ]
    assert set(bench[0]) == {*ledger.BENCH_COLUMNS, "origin", "pushed_from"}
    tables = {
        "deploys": deploys,
        "last_good": list(last.values()),
        "good_units": good,
        "bench_results": bench,
        "campaigns": campaigns,
        "trials": trials,
        "adoptions": adoptions,
    }
    return Filled(tables, [c["id"] for c in campaigns], per_trial * n.trials)


def fill_sqlite(file: Path, filled: Filled) -> int:
    """Migrate a new SQLite ledger as the tool does, then insert every row; how many."""
    store.use(str(file))
    ledger.ready()
    engine = sa.create_engine(f"sqlite:///{file}")
    count = 0
    try:
        with engine.begin() as conn:
            for name, rows in filled.tables.items():
                table = schema.metadata.tables[name]
                for at in range(0, len(rows), 10_000):
                    conn.execute(table.insert(), rows[at : at + 10_000])
                count += len(rows)
    finally:
        engine.dispose()
    return count


# --- timing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    seconds: float
    out: str
    max_rss_mib: float


def run(argv: list[str], env: dict[str, str]) -> Ran:
    """A command's wall time, its output and its peak memory; a failure ends the benchmark."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        begun = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - begun
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{text[-2000:]}\n{errors[-2000:]}")
    return Ran(took, text, usage.ru_maxrss / 1024)


@dataclass(frozen=True)
class Engine:
    name: str  # SQLite, PostgreSQL
    ledger: str  # what --ledger would say: the file, or the URL
    env: dict[str, str]


def engine_env(state: Path, url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != store.ENV}
    env.update(ORCHESTRATOR_STATE_DIR=str(state), COLUMNS=COLUMNS, PYTHONPATH=str(REPO))
    if url:
        env[store.ENV] = url
    return env


def in_process(engine: Engine, call: Callable[[], object], repeat: int) -> float:
    """The median seconds of `call` reading `engine`'s ledger, after one call to connect."""
    store.use(engine.ledger)
    call()
    times = []
    for _ in range(repeat):
        begun = time.perf_counter()
        call()
        times.append(time.perf_counter() - begun)
    return statistics.median(times)


def resume_reads(campaign_id: str) -> dict[str, Any]:
    """What a campaign's resume reads from the ledger, in a fresh process (--resume-reads)."""
    begun = time.perf_counter()
    found = ledger.campaign(campaign_id)
    trials = ledger.trials(campaign_id)
    bench = ledger.bench_results(sweep_id=campaign_id)
    took = time.perf_counter() - begun
    return {"seconds": took, "campaign": found is not None, "trials": len(trials), "bench": len(bench)}


# --- two writers at once --------------------------------------------------------------------------


def write_campaign(campaign_id: str, trials: int, bench: int, go: Path) -> dict[str, Any]:
    """One process's campaign (--write-campaign): its row, then each trial's bench rows and the
    trial, as a campaign records them; how many of each it wrote (the calls that returned)."""
    rng = random.Random(campaign_id)
    ledger.ready()  # connected and migrated before the start
    go.with_name(go.name + f".{campaign_id}").touch()
    while not go.exists():
        time.sleep(0.001)
    written = {"campaigns": 0, "trials": 0, "bench_results": 0}
    failed: list[str] = []

    def attempt(table: str, write: Callable[[], object]) -> None:
        try:
            write()
            written[table] += 1
        except Exception as e:  # counted, not fatal: what reaches the ledger is the question
            failed.append(f"{table}: {type(e).__name__}: {e}"[:300])

    begun, started = time.perf_counter(), time.time()
    row = _campaign_row(rng, campaign_id, time.time(), HOSTS[:2])
    row = {k: v for k, v in row.items() if k not in ("holder", "heartbeat", "origin", "time", "outcome")}
    attempt("campaigns", lambda: ledger.record_campaign(row | {"status": "running"}))
    for number in range(trials):
        host, profile, curve = HOSTS[number % 2], rng.choice(PROFILES), _hex(rng)
        for j in range(bench):
            b = _bench_row(rng, 0, host, profile, campaign_id, curve, LEVELS[j % 4], j // 4, DATASETS[1])
            b = {k: v for k, v in b.items() if k not in ("time", "origin", "model_digest")}
            attempt("bench_results", lambda b=b: ledger.record_bench(b))
        t = _trial_row(rng, campaign_id, number, 0, host, profile, curve)
        t = {k: v for k, v in t.items() if k not in ("time", "origin", "pushed_from")}
        attempt("trials", lambda t=t: ledger.record_trial(t))
    took = time.perf_counter() - begun
    return {
        "campaign": campaign_id,
        "written": written,
        "failed": failed,
        "seconds": took,
        "span": [started, time.time()],
    }


def race(engine: Engine, folder: Path, n: Sizes) -> list[dict[str, Any]]:
    """Two processes each write a campaign into `engine`'s ledger at once; per campaign, what it
    wrote and what the ledger holds afterwards."""
    go = folder / f"go-{engine.name}"
    ids = [uuid.uuid4().hex[:12] for _ in range(2)]
    argv = [sys.executable, str(Path(__file__).resolve()), "--race-trials", str(n.race_trials)]
    argv += ["--race-bench", str(n.race_bench), "--go", str(go), "--write-campaign"]
    procs = [
        subprocess.Popen(
            [*argv, cid], env=engine.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for cid in ids
    ]
    deadline = time.monotonic() + 120
    while not all(go.with_name(go.name + f".{cid}").exists() for cid in ids):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    begun = time.perf_counter()
    go.touch()
    reports = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            sys.exit(
                f"a writer failed ({p.returncode}) on {engine.name}:\n{out.decode()}\n{err.decode()[-3000:]}"
            )
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    wall = time.perf_counter() - begun
    store.use(engine.ledger)
    for r in reports:
        cid = r["campaign"]
        r["found"] = {
            "campaigns": int(ledger.campaign(cid) is not None),
            "trials": len(ledger.trials(cid)),
            "bench_results": len(ledger.bench_results(sweep_id=cid)),
        }
        r["wall"] = wall
    return reports


# --- the report -----------------------------------------------------------------------------------


def _s(seconds: float) -> str:
    return f"{seconds:10.4f}" if seconds < 1 else f"{seconds:10.2f}"


def print_table(rows: list[tuple[str, float, float]], help_s: tuple[float, float]) -> None:
    head = f"{'command':48} {'SQLite s':>10} {'PostgreSQL s':>12} {'ratio':>7}"
    print(f"{head} {'SQLite/help':>11} {'PG/help':>8}")
    for label, lite, pg in rows:
        ratio = pg / lite if lite else float("nan")
        print(
            f"{label:48} {_s(lite)} {_s(pg):>12} {ratio:7.2f} {lite / help_s[0]:11.2f} {pg / help_s[1]:8.2f}"
        )


def load_pg() -> ModuleType:
    """tests/pg.py: a throwaway PostgreSQL cluster."""
    spec = importlib.util.spec_from_file_location("bench_ledger_pg", REPO / "tests" / "pg.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchmark(n: Sizes, folder: Path, pg: Any, slow_s: float) -> None:
    total_begun = time.perf_counter()
    lite_state, pg_state = folder / "state-sqlite", folder / "state-pg"
    pg_state.mkdir()
    file = lite_state / "ledger.sqlite"
    url = pg.create_db("ledger")
    lite = Engine("SQLite", str(file), engine_env(lite_state, None))
    post = Engine("PostgreSQL", url, engine_env(pg_state, url))
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(lite_state)
    filled = fill(n, file, pg, url, post)
    print()
    rows, help_s = time_commands(n, lite, post, slow_s)
    rows += time_reads(n, filled, lite, post)
    print(
        f"median of {n.repeat} runs (a campaign: {n.trials} trials, {filled.per_campaign} bench rows); "
        "ratio: PostgreSQL / SQLite; /help: the command's time / `--help`'s"
    )
    print_table(rows, help_s)
    print()
    races(n, folder, lite, post)
    print()
    print(f"benchmark took {time.perf_counter() - total_begun:.0f} s")


def fill(n: Sizes, file: Path, pg: Any, url: str, post: Engine) -> Filled:
    """The SQLite ledger filled in-process, then pushed into PostgreSQL with `ledger push`."""
    begun = time.perf_counter()
    filled = rows_of(n, time.time())
    made = time.perf_counter() - begun
    begun = time.perf_counter()
    count = fill_sqlite(file, filled)
    inserted = time.perf_counter() - begun
    t = {name: len(rows) for name, rows in filled.tables.items()}
    print(
        f"ledger: {t['bench_results']:,} bench rows, {t['deploys']:,} deploys, {t['campaigns']:,} "
        f"campaigns, {t['trials']:,} trials, {t['good_units']:,} good units ({len(HOSTS)} hosts, "
        f"{len(PROFILES)} profiles, {len(DATASETS)} datasets); {count:,} rows in all"
    )
    version = pg.psql("SHOW server_version").strip()
    print(
        f"PostgreSQL {version} on 127.0.0.1 ({', '.join(f'{k}={v}' for k, v in PG_SETTINGS.items())}); "
        f"SQLite {sqlite3.sqlite_version} (WAL), file {file.stat().st_size / 2**20:.0f} MiB"
    )
    print(f"made the rows in {made:.1f} s; inserted into SQLite (SQLAlchemy executemany) in {inserted:.1f} s")
    argv = [sys.executable, "-m", "orchestrator", "ledger", "push", url, "--from", str(file), "--json"]
    push = run(argv, post.env)
    said = json.loads(push.out)
    pg.psql("VACUUM ANALYZE", url)  # as autovacuum does soon after a load that size
    held = team.status(store.parse(url)).rows
    found = sum(held.values())
    print(
        f"ledger push SQLite -> PostgreSQL: {push.seconds:.1f} s for {found:,} rows "
        f"({found / push.seconds:,.0f} rows/s), peak memory {push.max_rss_mib:.0f} MiB; then VACUUM "
        "ANALYZE, as autovacuum would"
    )
    copied, had = sum(said["copied"].values()), sum(said["had"].values())
    if copied != found:
        print(f"  the push said: {copied:,} copied, {had:,} already there (PostgreSQL holds {found:,})")
    lite_rows = team.status(store.parse(str(file))).rows
    if lite_rows != held:
        print(f"  rows differ after the push: SQLite {lite_rows}, PostgreSQL {held}")
    return filled


def time_commands(
    n: Sizes, lite: Engine, post: Engine, slow_s: float
) -> tuple[list[tuple[str, float, float]], tuple[float, float]]:
    """Each command's median seconds per engine, as a user runs it; a command slower than
    `slow_s` on its first run is run once."""
    host, profile = HOSTS[6], PROFILES[7]
    commands = [
        ("--help (baseline)", ["--help"]),
        ("history", ["history"]),
        (f"history --host {host}", ["history", "--host", host]),
        ("results", ["results"]),
        ("results --format csv", ["results", "--format", "csv"]),
        (f"results --profile {profile}", ["results", "--profile", profile]),
        ("ledger status", ["ledger", "status"]),
    ]
    if n.quick:
        commands = [c for c in commands if c[0] in QUICK_COMMANDS]
    took: dict[tuple[str, str], list[float]] = {}
    for k in range(n.repeat):
        for label, argv in commands:
            if k and max(took[label, "SQLite"][0], took[label, "PostgreSQL"][0]) > slow_s:
                continue
            for e in (lite, post):  # interleaved: a noisy moment hits both
                ran = run([sys.executable, "-m", "orchestrator", *argv], e.env)
                took.setdefault((label, e.name), []).append(ran.seconds)
    rows = []
    for label, _ in commands:
        runs = len(took[label, "SQLite"])
        shown = label if runs == n.repeat else f"{label} ({runs} run{'s' if runs > 1 else ''})"
        rows.append((shown, *(statistics.median(took[label, e]) for e in ("SQLite", "PostgreSQL"))))
    return rows, (rows[0][1], rows[0][2])


def time_reads(n: Sizes, filled: Filled, lite: Engine, post: Engine) -> list[tuple[str, float, float]]:
    """What a campaign's resume reads, in this process (connected) and in a fresh one."""
    picks = random.Random(7).sample(filled.campaigns, min(len(filled.campaigns), n.repeat + 1))
    cycle = _cycle(picks)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("ledger.campaign(id)", lambda: ledger.campaign(next(cycle))),
        ("ledger.trials(id)", lambda: ledger.trials(next(cycle))),
        ("ledger.bench_results(sweep_id=id)", lambda: ledger.bench_results(sweep_id=next(cycle))),
        ("ledger.bench_results(), every row", lambda: ledger.bench_results()),
    ]
    rows = []
    for label, call in calls:
        rows.append((f"  {label}", in_process(lite, call, n.repeat), in_process(post, call, n.repeat)))
    fresh: dict[str, list[float]] = {}
    worker = [sys.executable, str(Path(__file__).resolve()), "--resume-reads"]
    for cid in picks[: max(1, min(3, n.repeat))]:
        for e in (lite, post):
            got = json.loads(run([*worker, cid], e.env).out)
            assert got["campaign"] and got["trials"] and got["bench"], got
            fresh.setdefault(e.name, []).append(got["seconds"])
    label = "  the resume's 3 reads in a fresh process"
    rows.append((label, statistics.median(fresh["SQLite"]), statistics.median(fresh["PostgreSQL"])))
    return rows


def races(n: Sizes, folder: Path, lite: Engine, post: Engine) -> None:
    writes = 1 + n.race_trials * (1 + n.race_bench)
    print(
        f"two campaigns from two processes at once: each writes 1 campaign, {n.race_trials} trials, "
        f"{n.race_trials * n.race_bench} bench rows ({writes} writes, one transaction each)"
    )
    head = ("engine", "campaign", "written", "found", "lost", "failed", "writer s", "rows/s")
    print(f"{head[0]:11} {head[1]:13} " + " ".join(f"{h:>8}" for h in head[2:]))
    for e in (post, lite):
        reports = race(e, folder, n)
        lost = written = found = failures = 0
        for r in reports:
            w, f = sum(r["written"].values()), sum(r["found"].values())
            gone = sum(r["written"][k] - r["found"][k] for k in r["written"])
            lost, written, found, failures = lost + gone, written + w, found + f, failures + len(r["failed"])
            numbers = (w, f, gone, len(r["failed"]), f"{r['seconds']:.2f}", f"{w / r['seconds']:.0f}")
            print(f"{e.name:11} {r['campaign']:13} " + " ".join(f"{x:>8}" for x in numbers))
            for why in r["failed"][:3]:
                print(f"    failed: {why}")
        spans = [r["span"] for r in reports]
        overlap = max(0.0, min(end for _, end in spans) - max(start for start, _ in spans))
        print(
            f"{e.name}: {written} rows written, {found} found, lost {lost}, failed writes {failures}, "
            f"both done in {reports[0]['wall']:.2f} s, writing at the same time for {overlap:.2f} s"
        )


def _cycle(items: list[str]) -> Iterator[str]:
    while True:
        yield from items


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, help="bench rows (default 100000; --quick: 400)")
    parser.add_argument("--deploys", type=int, help="deploys (default 10000; --quick: 100)")
    parser.add_argument(
        "--repeat", type=int, help="runs per command, the median shown (default 5; --quick: 1)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: small sizes, one run each, 4 of the commands"
    )
    parser.add_argument(
        "--slow",
        type=float,
        default=60.0,
        metavar="S",
        help="run once a command whose first run takes over S s",
    )
    # A worker process of the benchmark's own (not for users).
    parser.add_argument("--write-campaign", metavar="ID", help=argparse.SUPPRESS)
    parser.add_argument("--resume-reads", metavar="ID", help=argparse.SUPPRESS)
    parser.add_argument("--race-trials", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--race-bench", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--go", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_campaign:
        print(json.dumps(write_campaign(args.write_campaign, args.race_trials, args.race_bench, args.go)))
        return
    if args.resume_reads:
        print(json.dumps(resume_reads(args.resume_reads)))
        return
    n = sizes(args)
    pg_mod = load_pg()
    pg_mod.SETTINGS = {**pg_mod.SETTINGS, **PG_SETTINGS}
    folder = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    pg = None
    try:
        pg = pg_mod.Postgres.start()
        benchmark(n, folder, pg, args.slow)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
