"""sweep: deploy each profile, bench it, record it, then put the best one back.

Engine layer: never prints. `sweep()` returns a `SweepReport`. `ranking()` turns ledger-shaped rows
into the ranked entries the CLI shows. Each is compared with the baseline at its own level
(stats.compare: Welch's t-test over the runs). `curves()` turns the rows into tok/s against load.

Deploys go through `deploy.deploy()`. So a sweep has every safety a deploy has: the lock, the GPU
idle check, the health wait, and rollback of a failed host.
"""

from __future__ import annotations

import sqlite3
import statistics
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from orchestrator import ledger
from orchestrator.errors import InputError, Interrupted, OrchestratorError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts.host_report import DeployReport
from orchestrator.hosts.runner import TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch, systemd_check
from orchestrator.tuning import bench as bench_mod
from orchestrator.tuning import stats

#: A bench row: the ledger's (sqlite3.Row), or a dict (BenchResult.row(), a caller's hand-made row).
LedgerRow: TypeAlias = sqlite3.Row | Mapping[str, Any]


@dataclass(frozen=True)
class Level:
    """What makes bench rows comparable: the same requests (endpoint, dataset by its digest,
    temperature, max_tokens) under the same load (concurrency, or an open loop's request rate).
    Rows from before these were recorded read as the columns' defaults and form a level of their own.
    """

    endpoint: str = "generate"
    dataset_digest: str = ""
    concurrency: int = 0
    request_rate: float | None = None
    temperature: float = 0.0
    max_tokens: int = 0
    #: the dataset's name as the first row of the level gave it; the digest is what counts
    dataset: str = field(default="", compare=False)

    @property
    def load(self) -> str:
        """`c=8` (closed loop: that many requests in flight) or `4/s` (open loop)."""
        return f"c={self.concurrency}" if self.request_rate is None else f"{self.request_rate:g}/s"

    @property
    def x(self) -> float:
        """Where the level lies along its curve: the concurrency, or the request rate."""
        return float(self.concurrency) if self.request_rate is None else self.request_rate

    @property
    def axis(self) -> str:
        return "concurrency" if self.request_rate is None else "requests/s"

    @property
    def workload(self) -> str:
        """The level without its load: what one curve of tok/s against load holds fixed."""
        data = self.dataset or "built-in prompts"
        if self.dataset_digest:
            data += f" {self.dataset_digest[:8]}"
        cap = f", c<={self.concurrency}" if self.request_rate is not None and self.concurrency else ""
        return f"{self.endpoint}, {data}, T={self.temperature:g}, {self.max_tokens} tokens{cap}"

    @property
    def series(self) -> tuple[Any, ...]:
        """The key of the curve this level lies on: all but the load along its axis."""
        cap = self.concurrency if self.request_rate is not None else None
        return (self.endpoint, self.dataset_digest, self.temperature, self.max_tokens, self.axis, cap)

    def label(self) -> str:
        return f"{self.workload}, {self.load}"

    def sort_key(self) -> tuple[Any, ...]:
        endpoint, digest, temperature, max_tokens, axis, cap = self.series
        return (endpoint, digest, temperature, max_tokens, axis, cap or 0, self.x)


def _column(row: LedgerRow, name: str, default: Any) -> Any:
    """row[name], or `default` where the row has no such key (a caller's hand-made row)."""
    try:
        value = row[name]
    except (KeyError, IndexError):  # sqlite3.Row raises IndexError
        return default
    return default if value is None else value


def level_of(row: LedgerRow) -> Level:
    """The level a ledger row (or BenchResult.row()) was measured at."""
    rate = _column(row, "request_rate", None)
    return Level(
        endpoint=str(_column(row, "endpoint", "generate")),
        dataset_digest=str(_column(row, "dataset_digest", "")),
        concurrency=int(_column(row, "concurrency", 0)),
        request_rate=None if rate is None else float(rate),
        temperature=float(_column(row, "temperature", 0.0)),
        max_tokens=int(_column(row, "max_tokens", 0)),
        dataset=str(_column(row, "dataset", "")),
    )


@dataclass
class Entry:
    """One profile's outcome at one level over its repeats, ready to rank."""

    profile: str
    ok: bool
    speculative: bool = False
    tok_s: list[float] = field(default_factory=list)
    accept_len: float | None = None
    diagnosis: str = ""
    #: ratio of this entry's mean to the baseline's at the same level
    speedup: float | None = None
    #: None for an entry of rows that never measured anything (a profile that failed to start)
    level: Level | None = None
    #: against the baseline's runs at the same level (stats.compare); None for the baseline
    #: itself, a failed entry, or a level without a baseline run
    verdict: stats.Verdict | None = None
    p_value: float | None = None

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.tok_s) if self.tok_s else None

    @property
    def interval(self) -> stats.Interval | None:
        """The mean's 95% interval over the runs (low and high None for one run)."""
        return stats.interval(self.tok_s) if self.tok_s else None

    @property
    def warning(self) -> str:
        weak = self.speculative and self.accept_len is not None and self.accept_len <= bench_mod.DRAFTER_FLOOR
        return bench_mod.DRAFTER_WARNING if weak else ""


def measured(row: LedgerRow) -> bool:
    """A row of a run that produced a number (not a failed start or a bench of errors only)."""
    return row["result"] == "ok" and row["tok_s"] is not None


def by_files(rows: list[LedgerRow]) -> list[LedgerRow]:
    """`rows`, where one profile ran on two sets of model files (a new drafter checkpoint under the
    same name), with the older sets' rows named `PROFILE (files DIGEST)`: they are never averaged
    with the newest's. Rows whose files are not known (before the ledger kept them) stay as they are."""
    newest: dict[str, tuple[float, str]] = {}
    for r in rows:
        files = str(_column(r, "model_digest", ""))
        if files and (r["profile"] not in newest or float(r["time"]) >= newest[r["profile"]][0]):
            newest[r["profile"]] = (float(r["time"]), files)
    out: list[LedgerRow] = []
    for r in rows:
        files = str(_column(r, "model_digest", ""))
        if files and files != newest[r["profile"]][1]:
            r = {**dict(r), "profile": f"{r['profile']} (files {files})"}
        out.append(r)
    return out


def ranking(rows: Iterable[LedgerRow], baseline: str | None) -> list[Entry]:
    """Entries per profile and level, each compared with `baseline`'s runs at its own level.

    Levels in order (Level.sort_key); within one, the fastest first and failed ones last. Rows of
    a level where nothing was measured (a profile that failed to start records no load) become one
    failed entry per profile that has no other, at the very end.
    """
    rows = by_files(list(rows))
    at: dict[Level, list[LedgerRow]] = {}
    for r in rows:
        at.setdefault(level_of(r), []).append(r)
    levels = sorted((lv for lv, rs in at.items() if any(measured(r) for r in rs)), key=Level.sort_key)
    entries = [e for lv in levels for e in _rank(at[lv], baseline, lv)]
    ranked, anywhere = {e.profile for e in entries}, set(levels)
    never = [r for r in rows if r["profile"] not in ranked and level_of(r) not in anywhere]
    return entries + _rank(never, baseline, None)


def _level_accept(row: LedgerRow) -> float | None:
    """The accept length of this run's own requests (bench.own_accept): never the server's
    cumulative figure, which mixes in every request since it started."""
    names = ("accept_len_client", "accept_len_log", "accept_len", "speculative")
    return bench_mod.own_accept({k: _column(row, k, None) for k in names})


def _rank(rows: Iterable[LedgerRow], baseline: str | None, level: Level | None) -> list[Entry]:
    """Rows of one level: entries per profile, fastest first (failed ones last), against `baseline`."""
    entries: dict[str, Entry] = {}
    for r in rows:
        e = entries.setdefault(r["profile"], Entry(r["profile"], ok=False, level=level))
        e.speculative = e.speculative or bool(r["speculative"])
        if measured(r):
            e.ok = True
            e.tok_s.append(float(r["tok_s"]))
            accept = _level_accept(r)
            if accept is not None:
                e.accept_len = accept
        elif r["diagnosis"]:
            e.diagnosis = str(r["diagnosis"])
    base = entries.get(baseline or "")
    base_mean = base.mean if base else None
    for e in entries.values():
        if base_mean and e.mean is not None:
            e.speedup = e.mean / base_mean
        if e.ok:
            e.diagnosis = ""
        if e.ok and base is not None and base.ok and e is not base:
            found = stats.compare(e.tok_s, base.tok_s)
            e.verdict, e.p_value = found.verdict, found.p_value
    return sorted(entries.values(), key=lambda e: (not e.ok, -(e.mean or 0.0)))


@dataclass
class Curve:
    """One profile's entries along one series of levels (tok/s against concurrency or rate)."""

    profile: str
    #: Level.workload of its levels: what the curve holds fixed
    workload: str
    #: "concurrency" or "requests/s"
    axis: str
    #: one per level, by load
    entries: list[Entry]


def curves(rows: Iterable[LedgerRow], baseline: str | None) -> list[Curve]:
    """Per series of levels (Level.series) and per profile that ran there, a curve of its entries.

    Series in level order; within one, the baseline's curve first, then the profiles in the order
    of their first entry (the fastest at the lowest load first).
    """
    grouped: dict[tuple[Any, ...], dict[str, list[Entry]]] = {}
    for e in ranking(rows, baseline):
        if e.ok and e.level is not None:
            grouped.setdefault(e.level.series, {}).setdefault(e.profile, []).append(e)
    found = []
    for by_profile in grouped.values():
        names = sorted(by_profile, key=lambda name: name != baseline)  # stable: the baseline first
        for name in names:
            points = sorted(by_profile[name], key=lambda e: e.level.x if e.level else 0.0)
            level = points[0].level
            assert level is not None
            found.append(Curve(name, level.workload, level.axis, points))
    return found


def standing(
    host: str, baseline: str = "baseline", level: Level | None = None
) -> tuple[Entry | None, Entry | None]:
    """From the ledger's bench rows of one host at one level: the baseline profile's entry and the
    fastest. The level defaults to that of the host's newest measured run."""
    rows = ledger.bench_results(host=host)
    if level is None:
        newest = [r for r in rows if measured(r)][-1:]
        if not newest:
            return None, None
        level = level_of(newest[0])
    entries = ranking([r for r in rows if level_of(r) == level], baseline)
    base = next((e for e in entries if e.profile == baseline and e.ok), None)
    return base, next((e for e in entries if e.ok), None)


@dataclass
class SweepReport:
    sweep_id: str
    baseline: str
    entries: list[Entry]
    left: str = ""
    left_ok: bool = False
    left_message: str = ""


def load_profiles(refs: Sequence[str]) -> dict[str, profile_mod.Profile]:
    """Every profile loaded, planned and its unit read by systemd here once, before any host is
    touched: reference -> Profile, in order, each once."""
    loaded: dict[str, profile_mod.Profile] = {}
    for ref in refs:
        if ref not in loaded:
            loaded[ref] = profile_mod.load(ref)
            systemd_check.require(loaded[ref], [launch.build(loaded[ref])])
    if not loaded:
        raise InputError("give at least one profile to sweep")
    return loaded


def _failure(report: DeployReport) -> str:
    """The first failed host's diagnosis, with where it was rolled back to."""
    bad = next((h for h in report.hosts if not h.ok), None)
    if bad is None:
        return "deploy failed"
    text = f"{bad.host}: {bad.diagnosis or bad.message or bad.step}"
    if bad.rolled_back_to:
        text += f" (rolled back to {bad.rolled_back_to})"
    return text


def _one_profile(
    prof: profile_mod.Profile,
    inventory: Path,
    limit: str | None,
    traffic: bench_mod.Traffic,
    ctx: _Context,
) -> None:
    """Deploy one profile and bench its traffic (each level, `repeat` times); a failure becomes
    a ledger row, not an exception."""
    spec = prof.speculative.algorithm is not None
    base_row = {"sweep_id": ctx.sweep_id, "profile": prof.name, "speculative": int(spec)}
    ctx.by_name[prof.name] = prof
    ctx.phase(f"deploy {prof.name}")
    report = deploy_mod.deploy(prof, inventory, deploy_mod.Options(limit=limit), ctx.on_event)
    if report.interrupted:
        raise Interrupted(
            f"sweep {ctx.sweep_id} stopped by Ctrl-C while deploying {prof.name}: {_failure(report)}; "
            "the benches before it are in the ledger (`results`)"
        )
    levels = traffic.levels()
    for h in report.hosts:  # each profile's restart cost, where its start went
        if h.startup:
            ctx.phase(f"{prof.name} on {h.host}: {h.startup}")
    if not report.ok:
        host = report.hosts[0].host if report.hosts else ""
        for settings in levels:
            _record_failure(base_row, report.run_id, host, _failure(report), settings, report.digest)
        return
    try:
        target = bench_mod.deployed_target(inventory, limit, prof)
    except OrchestratorError as exc:
        for settings in levels:
            _record_failure(base_row, report.run_id, "", f"bench failed: {exc}", settings, report.digest)
        return
    try:
        _bench_levels(prof, target, inventory, traffic, base_row, ctx)
    except KeyboardInterrupt:
        raise Interrupted(
            f"sweep {ctx.sweep_id} stopped by Ctrl-C while benching {prof.name}; the benches before "
            "it are in the ledger (`results`), and nothing was restored"
        ) from None


def _bench_levels(
    prof: profile_mod.Profile,
    target: bench_mod.Target,
    inventory: Path,
    traffic: bench_mod.Traffic,
    base_row: dict[str, Any],
    ctx: _Context,
) -> None:
    """Each level of the traffic, `repeat` times, on the deployed profile; each run recorded."""
    levels = traffic.levels()
    log = bench_mod.journal_messages(inventory, target.host)
    curve_id = uuid.uuid4().hex[:12]
    for settings in levels:
        for k in range(traffic.repeat):
            where = f" at {settings.level}" if len(levels) > 1 else ""
            ctx.phase(
                f"bench {prof.name}{where}" + (f" ({k + 1}/{traffic.repeat})" if traffic.repeat > 1 else "")
            )
            try:
                result = bench_mod.run(target, settings, ctx.on_progress, log)
            except OrchestratorError as exc:
                _record_failure(
                    base_row, uuid.uuid4().hex[:12], target.host, f"bench failed: {exc}", settings
                )
                continue
            result.curve_id, result.repeat = curve_id, k
            bench_mod.record(result, ctx.sweep_id)


def _record_failure(
    base: dict[str, Any], run_id: str, host: str, why: str, settings: bench_mod.Settings, digest: str = ""
) -> None:
    row: dict[str, Any] = {"run_id": run_id, "host": host, "result": "failed", "diagnosis": why}
    row |= {"digest": digest, "plan_digest": digest, "git_commit": bench_mod.git_commit()}
    row |= {
        "concurrency": settings.concurrency,
        "max_tokens": settings.max_tokens,
        "requests": settings.requests,
    }
    row |= bench_mod.BenchResult(bench_mod.Target(host, "", 0), settings, [], 0.0).traffic_columns()
    ledger.record_bench(base | row)


@dataclass
class _Context:
    sweep_id: str
    on_event: Callable[[TaskEvent], None] | None
    on_progress: Callable[[str, int, int], None] | None
    on_phase: Callable[[str], None] | None
    #: profile name -> the profile swept under it
    by_name: dict[str, profile_mod.Profile] = field(default_factory=dict)

    def phase(self, text: str) -> None:
        if self.on_phase:
            self.on_phase(text)


def sweep(
    loaded: Mapping[str, profile_mod.Profile],
    profiles: Sequence[str],
    inventory: Path,
    *,
    limit: str | None = None,
    baseline: str | None = None,
    leave: str | None = None,
    traffic: bench_mod.Traffic | None = None,
    on_event: Callable[[TaskEvent], None] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> SweepReport:
    """For each profile: deploy, bench its traffic, record. Then deploy the best healthy one (or
    `leave`).

    `loaded` holds every profile named here (`load_profiles`). The baseline is swept first
    when it is not among the profiles; default: `baseline` if it is listed, else the first.
    """
    pd = next((p for p in loaded.values() if p.disaggregation is not None), None)
    if pd is not None:
        raise InputError(
            f"{pd.name} is a server of a prefill/decode fleet: sweep benches one host alone, and a PD "
            "server serves only in a pair; deploy the fleet and bench it with `bench --gateway` (docs/pd.md)"
        )
    ledger.ready()
    names = list(dict.fromkeys(profiles))
    if baseline and baseline not in names:
        names.insert(0, baseline)
    base = baseline or ("baseline" if "baseline" in names else names[0])
    ctx = _Context(uuid.uuid4().hex[:12], on_event, on_progress, on_phase)
    for ref in names:
        _one_profile(loaded[ref], inventory, limit, traffic or bench_mod.Traffic(), ctx)
    rows = ledger.bench_results(sweep_id=ctx.sweep_id)
    report = SweepReport(ctx.sweep_id, loaded[base].name, [])
    report.entries = ranking(rows, report.baseline)
    _leave(report, inventory, limit, loaded[leave] if leave else None, ctx)
    return report


def _leave(
    report: SweepReport, inventory: Path, limit: str | None, leave: profile_mod.Profile | None, ctx: _Context
) -> None:
    """Deploy the profile to leave running: `leave`, else the best healthy one (`best`)."""
    best = best_profile(report.entries)
    prof = leave or ctx.by_name.get(best or "")
    report.left = prof.name if prof else ""
    if prof is None:
        report.left_message = "no profile was healthy: nothing restored"
        return
    ctx.phase(f"restore {report.left}")
    done = deploy_mod.deploy(prof, inventory, deploy_mod.Options(limit=limit), ctx.on_event)
    report.left_ok = done.ok
    report.left_message = "" if done.ok else _failure(done)


def best_profile(entries: Sequence[Entry]) -> str | None:
    """The fastest healthy profile; over several levels, the one measured at every level with the
    highest mean of its tok/s relative to each level's fastest (not the fastest at the lowest
    load alone, where speculation wins most)."""
    levels = {e.level for e in entries if e.ok}
    if len(levels) <= 1:
        return next((e.profile for e in entries if e.ok), None)
    fastest = {lv: max(e.mean or 0.0 for e in entries if e.ok and e.level == lv) for lv in levels}
    scores: dict[str, list[float]] = {}
    for e in entries:
        if e.ok and e.mean is not None and fastest[e.level]:
            scores.setdefault(e.profile, []).append(e.mean / fastest[e.level])
    everywhere = {p: v for p, v in scores.items() if len(v) == len(levels)}
    if not everywhere:
        return None
    return max(everywhere, key=lambda p: statistics.fmean(everywhere[p]))
