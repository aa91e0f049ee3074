"""Reports: what happened on each host, in the words a user needs, built from typed facts."""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from orchestrator import paths
from orchestrator.hosts import startup_watch
from orchestrator.hosts.diagnose import classify
from orchestrator.hosts.module_results import HealthFailed, HealthResult, UnitDiff
from orchestrator.hosts.readback import STEPS, HostFacts, step_of


@dataclass
class HostReport:
    """What happened on one host."""

    host: str
    ok: bool
    step: str
    changed: bool = False
    restarted: bool = False
    healthy_after_s: float | None = None
    digest: str = ""
    previous_digest: str = ""
    message: str = ""
    reasons: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    diff: str = ""
    previous_unit: str = ""
    #: The unit this host was to get (a multi-node rank has its own).
    planned_unit: str = ""
    gpus: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    diagnosis: str = ""
    killed: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Whether this run stopped the host's server (only then is a rollback owed).
    stopped: bool = False
    #: Whether this run took the host's deploy lock (it was about to change the host).
    locked: bool = False
    #: When the server process exited during the health wait (systemd's realtime stamp), if it did.
    exited_at: str = ""
    last_good: dict[str, Any] = field(default_factory=dict)
    rolled_back_to: str = ""
    rollback_error: str = ""
    #: A drain through the gateway: {url, worker_url, out, drain, prove, back} (facts.gateway_steps),
    #: and after a rollback or Ctrl-C `left_out` when the worker stayed out of rotation, saying why.
    gateway: dict[str, Any] = field(default_factory=dict)
    #: The start's phases, [{phase, s}] in their order, as the server's log showed them.
    phases: list[dict[str, Any]] = field(default_factory=list)
    #: Where a healthy start went: `healthy after 6m12s: weights 4m10s, CUDA graphs 1m40s, ...`.
    startup: str = ""
    #: GPU memory of the start: {"predicted": memfit's fit before the stop, "measured": what the
    #: server logged (weights, KV tokens, graphs)}, each where known.
    memory: dict[str, Any] = field(default_factory=dict)
    #: The files the start reads (model_digest of preflight's model_files); "" where not scanned.
    model_digest: str = ""
    #: What was read into the page cache before the stop (sglang_probe's read_ahead); {} if none.
    read_ahead: dict[str, Any] = field(default_factory=dict)
    #: The hand-started server this deploy stopped first (sglang_restart's takeover step:
    #: {taken, pid, killed, log, ...}); {} when it took over none.
    takeover: dict[str, Any] = field(default_factory=dict)
    #: Where the unit that took over failed: the hand command started again ({pid, healthy, log}
    #: or {error}); {} when none was owed.
    relaunched: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.pop("last_good")  # its unit text is in the ledger; keep the JSON readable
        data.pop("planned_unit")
        return data


@dataclass
class DeployReport:
    profile: str
    digest: str
    check: bool
    hosts: list[HostReport]
    artifacts: str
    run_id: str = ""
    #: Ctrl-C (or SIGTERM) stopped it; hosts it had changed were rolled back.
    interrupted: bool = False
    #: A rollback: each host went to its own recorded unit.
    rollback: bool = False

    @property
    def ok(self) -> bool:
        return bool(self.hosts) and all(h.ok for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "digest": self.digest,
            "check": self.check,
            "ok": self.ok,
            "artifacts": self.artifacts,
            "run_id": self.run_id,
            "interrupted": self.interrupted,
            "hosts": [h.to_json() for h in self.hosts],
        }


def host_report(f: HostFacts, digest: str, planned_unit: str, check: bool) -> HostReport:
    """A deploy's (or rollback's) report of one host."""
    probe, health = f.probe, f.health or HealthFailed()  # no wait ran: nothing known
    noop_healthy = not probe.restart_needed and probe.healthy
    restarted = probe.restart_needed and not check and f.failed is None
    report = HostReport(
        host=f.host,
        ok=f.failed is None and (check or health.reason == "healthy" or noop_healthy),
        step=step(f),
        changed=f.changed,
        restarted=restarted,
        healthy_after_s=_healthy_after(health, noop_healthy),
        digest=digest if restarted else probe.digest,
        previous_digest=probe.digest,
        message=f.message,
        reasons=probe.reasons,
        # A journal comes only with a failed wait.
        journal=list(health.journal or []) if isinstance(health, HealthFailed) and f.failed else [],
        diff=_diff(f.unit.diff if f.unit else None),
        previous_unit=probe.unit,
        planned_unit=planned_unit,
        gpus=f.gpus.summary() if f.gpus else {},
        elapsed_s=f.elapsed_s,
        killed=[k.model_dump() for k in f.gpus.killed] if f.gpus else [],
        problems=f.problems,
        stopped=f.stopped,
        locked=probe.locked,
        exited_at=(health.unit_state or {}).get("ExecMainExitTimestamp", "") if f.failed else "",
        last_good=probe.last_good,
        gateway=dict(f.gateway),
    )
    if f.health is not None and f.health.phases:
        report.phases = [p.model_dump() for p in f.health.phases]
        if report.ok and restarted and f.health.elapsed_s is not None:
            report.startup = startup_watch.summary(f.health.elapsed_s, f.health.phases)
    report.read_ahead = dict(probe.read_ahead or {})
    if f.takeover is not None:
        report.takeover = f.takeover.model_dump(exclude_none=True)
    preflight = probe.preflight
    if preflight is not None:
        report.model_digest = model_digest(preflight.model_files)
        if preflight.memory:
            report.memory["predicted"] = preflight.memory
    if f.health is not None and f.health.memory_lines:
        measured = paths.module_utils("orchestrator_host.memfit").parse_memory_lines(f.health.memory_lines)
        if measured:
            report.memory["measured"] = measured
    if f.failed:
        report.diagnosis = _diagnosis(report, f.health)
    return report


def model_digest(model_files: dict[str, Any]) -> str:
    """One short name of the files a start reads (modelfiles.files_digest): "" when not scanned."""
    return str(paths.module_utils("orchestrator_host.modelfiles").files_digest(model_files))


def step(f: HostFacts) -> str:
    """The step a host failed at, or the last it did; `connect` when it was never reached."""
    if f.unreachable:
        return "connect"
    if f.failed is not None:
        return step_of(f.failed) or "connect"
    return STEPS.get(next((a for a in reversed(f.done) if a in STEPS), ""), "connect")


def _diagnosis(report: HostReport, health: HealthResult | HealthFailed | None) -> str:
    if report.step == "preflight" and report.problems:
        return f"preflight: {len(report.problems)} problem(s), nothing was stopped: " + "; ".join(
            report.problems
        )
    if report.step == "health" and isinstance(health, HealthFailed) and health.stalled is not None:
        st = health.stalled
        nccl = startup_watch.nccl_of(_environment(report.planned_unit))
        return startup_watch.stall_diagnosis(
            st.phase, st.quiet_s, st.limit_s, nccl, _nnodes(report.planned_unit)
        )
    if report.step == "health" and health is not None:
        return str(classify(report.journal, health.unit_state, health.reason or ""))
    first = report.message.strip().splitlines()[0] if report.message.strip() else "no message"
    return f"failed at {report.step}: {first}"


def _environment(unit: str) -> dict[str, str]:
    """The unit's Environment= assignments, NAME -> value (systemd's quoting undone)."""
    found: dict[str, str] = {}
    for line in unit.splitlines():
        if not line.startswith("Environment="):
            continue
        try:
            words = shlex.split(line.removeprefix("Environment="), posix=True)
        except ValueError:
            continue
        for word in words:
            name, _, value = word.partition("=")
            found[name] = value
    return found


def _nnodes(unit: str) -> int:
    match = re.search(r"--nnodes[= ](\d+)", unit)
    return int(match.group(1)) if match else 1


def _healthy_after(health: HealthResult | HealthFailed, noop_healthy: bool) -> float | None:
    """Seconds from start to healthy; 0 for a server that was healthy and left alone."""
    if health.reason == "healthy":
        return health.elapsed_s
    return 0.0 if noop_healthy else None


def _diff(diff: UnitDiff | None) -> str:
    """The unit's diff as sglang_unit returned it (check mode with --diff)."""
    if diff is None:
        return ""
    return "".join(
        difflib.unified_diff(
            diff.before.splitlines(True), diff.after.splitlines(True), diff.before_header, diff.after_header
        )
    )
