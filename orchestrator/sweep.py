"""sweep: deploy each profile, bench it, record it; then put the best one back.

Engine layer: never prints. `sweep()` returns a `SweepReport`; `ranking()` turns ledger-shaped
rows into the ranked entries the CLI shows. Deploys go through `deploy.deploy()`, so a sweep
has every safety a deploy has (lock, GPU idle check, health wait, rollback of a failed host).
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import bench as bench_mod
from orchestrator import deploy as deploy_mod
from orchestrator import ledger, systemd_check
from orchestrator import plan as plan_mod
from orchestrator import profile as profile_mod
from orchestrator.errors import InputError, Interrupted, OrchestratorError
from orchestrator.runner import TaskEvent


@dataclass
class Entry:
    """One profile's outcome over its repeats, ready to rank."""

    profile: str
    ok: bool
    speculative: bool = False
    tok_s: list[float] = field(default_factory=list)
    accept_len: float | None = None
    diagnosis: str = ""
    speedup: float | None = None

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.tok_s) if self.tok_s else None

    @property
    def warning(self) -> str:
        weak = self.speculative and self.accept_len is not None and self.accept_len <= bench_mod.DRAFTER_FLOOR
        return bench_mod.DRAFTER_WARNING if weak else ""


def ranking(rows: Iterable[Mapping[str, Any]], baseline: str | None) -> list[Entry]:
    """Entries per profile, fastest first (failed ones last), speed-up against `baseline`'s mean."""
    entries: dict[str, Entry] = {}
    for r in rows:
        e = entries.setdefault(r["profile"], Entry(r["profile"], ok=False))
        e.speculative = e.speculative or bool(r["speculative"])
        if r["result"] == "ok" and r["tok_s"] is not None:
            e.ok = True
            e.tok_s.append(float(r["tok_s"]))
            if r["accept_len"] is not None:
                e.accept_len = float(r["accept_len"])
        elif r["diagnosis"]:
            e.diagnosis = str(r["diagnosis"])
    base = entries.get(baseline or "")
    base_mean = base.mean if base else None
    for e in entries.values():
        if base_mean and e.mean is not None:
            e.speedup = e.mean / base_mean
        if e.ok:
            e.diagnosis = ""
    return sorted(entries.values(), key=lambda e: (not e.ok, -(e.mean or 0.0)))


def standing(host: str, baseline: str = "baseline") -> tuple[Entry | None, Entry | None]:
    """From the ledger's bench rows of one host: the baseline profile's entry and the fastest."""
    entries = ranking([r for r in ledger.bench_results() if r["host"] == host], baseline)
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
            systemd_check.require(loaded[ref], [plan_mod.build(loaded[ref])])
    if not loaded:
        raise InputError("give at least one profile to sweep")
    return loaded


def _failure(report: deploy_mod.DeployReport) -> str:
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
    if not report.ok:
        host = report.hosts[0].host if report.hosts else ""
        for settings in levels:
            _record_failure(base_row, report.run_id, host, _failure(report), settings, report.digest)
        return
    target = bench_mod.deployed_target(inventory, limit, prof)
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
    row = {"run_id": run_id, "host": host, "result": "failed", "diagnosis": why}
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
    names = list(dict.fromkeys(profiles))
    if baseline and baseline not in names:
        names.insert(0, baseline)
    base = baseline or ("baseline" if "baseline" in names else names[0])
    ctx = _Context(uuid.uuid4().hex[:12], on_event, on_progress, on_phase)
    for ref in names:
        _one_profile(loaded[ref], inventory, limit, traffic or bench_mod.Traffic(), ctx)
    rows = [r for r in ledger.bench_results() if r["sweep_id"] == ctx.sweep_id]
    report = SweepReport(ctx.sweep_id, loaded[base].name, [])
    report.entries = ranking(rows, report.baseline)
    _leave(report, inventory, limit, loaded[leave] if leave else None, ctx)
    return report


def _leave(
    report: SweepReport, inventory: Path, limit: str | None, leave: profile_mod.Profile | None, ctx: _Context
) -> None:
    """Deploy the profile to leave running: `leave`, else the fastest healthy one."""
    best = next((e.profile for e in report.entries if e.ok), None)
    prof = leave or ctx.by_name.get(best or "")
    report.left = prof.name if prof else ""
    if prof is None:
        report.left_message = "no profile was healthy: nothing restored"
        return
    ctx.phase(f"restore {report.left}")
    done = deploy_mod.deploy(prof, inventory, deploy_mod.Options(limit=limit), ctx.on_event)
    report.left_ok = done.ok
    report.left_message = "" if done.ok else _failure(done)
