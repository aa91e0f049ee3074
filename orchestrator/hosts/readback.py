"""Facts in: each host's module results, typed, and picked by the module an event ran (its action).

The types are module_results.py's. A task's display name is for people, so renaming one in YAML
changes nothing here. The action names are the modules in plugins/modules (see
docs/architecture.md).

Every result of those modules in a play is validated on the way (of_run), whether it is read or not.
So a host whose module differs from orchestrator's is a ResultError, never a report read with
defaults.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator.hosts.module_results import (
    ADOPT,
    DRAIN,
    GATEWAY,
    GPU_IDLE,
    HEALTH,
    PREFLIGHT,
    PROBE,
    RECORD,
    RESTART,
    SHAPES,
    START,
    STOP,
    UNIT,
    UNITS,
    AdoptFailed,
    AdoptResult,
    BusyGpu,
    DrainFailed,
    DrainResult,
    GatewayFailed,
    GatewayResult,
    Gpu,
    GpuIdleFailed,
    GpuIdleResult,
    GpuProcess,
    HealthFailed,
    HealthResult,
    ModuleResult,
    PreflightFailed,
    PreflightResult,
    ProbeFailed,
    ProbeResult,
    StopFailed,
    StopResult,
    UnitFailed,
    UnitResult,
    UnitsInfoFailed,
    UnitsInfoResult,
    parse,
)
from orchestrator.hosts.runner import HostRun, TaskEvent

COMMAND = "ansible.builtin.command"
#: Only playbooks/tasks/restart_lockstep.yml's gate asserts: every rank of a multi-node server
#: restarts, or none is stopped.
RANKS_GATE = "ansible.builtin.assert"

#: Actions in play order, with the step name users see.
STEPS = {
    PROBE: "probe",
    PREFLIGHT: "preflight",
    GATEWAY: "gateway",
    DRAIN: "drain",
    RANKS_GATE: "ranks",
    #: The restart's one transaction (roles/sglang_restart) until its steps came back, each read
    #: as its own module's (runner.split_steps).
    RESTART: "restart",
    ADOPT: "take over",
    STOP: "stop",
    GPU_IDLE: "GPUs idle",
    UNIT: "write unit",
    START: "start",
    HEALTH: "health",
    RECORD: "record",
}


def typed(e: TaskEvent) -> ModuleResult | None:
    """The result of a finished task of one of orchestrator's modules, typed (module_results.parse):
    its success model, or its failure model (empty for an unreachable host, where it never ran).
    A progress report (a task still running, as the health wait's) reads as its success model.
    None for a start, a skip, or another action."""
    if e.action not in SHAPES or e.kind not in ("ok", "changed", "failed", "unreachable", "progress"):
        return None
    if e.kind == "unreachable":
        return SHAPES[e.action].failed()
    return parse(e.action, e.result, e.kind == "failed", e.host)


Ok = TypeVar("Ok", bound=ModuleResult)
Failed = TypeVar("Failed", bound=ModuleResult)


def _as(r: ModuleResult | None, ok: type[Ok], failed: type[Failed]) -> Ok | Failed | None:
    """`r`, a typed() result of one module, as that module's own models."""
    if r is None or isinstance(r, (ok, failed)):
        return r
    raise TypeError(f"{type(r).__name__} is neither {ok.__name__} nor {failed.__name__}")


def step_of(e: TaskEvent) -> str:
    """The step an event belongs to: a probe that failed on its preflight checks is `preflight`,
    a stop that failed on the GPUs is `GPUs idle`."""
    r = typed(e)
    if isinstance(r, ProbeResult | ProbeFailed) and r.preflight and r.preflight.problems:
        return STEPS[PREFLIGHT]
    if isinstance(r, StopFailed) and e.kind == "failed" and isinstance(r.gpus, GpuIdleResult) and r.gpus.busy:
        return STEPS[GPU_IDLE]
    if isinstance(r, GatewayResult | GatewayFailed) and r.state:
        return "gateway out" if r.state == "absent" else "gateway back"
    if isinstance(r, DrainResult | DrainFailed) and r.mode == "prove":
        return "prove"
    return STEPS.get(e.action, "")


@dataclass
class Gpus:
    """What nvidia-smi said of a host's GPUs (gpu_idle, or the GPU wait of sglang_stop)."""

    idle: bool | None = None
    gpus: list[Gpu] = field(default_factory=list)
    holders: list[GpuProcess] = field(default_factory=list)
    busy: list[BusyGpu] = field(default_factory=list)
    killed: list[GpuProcess] = field(default_factory=list)

    @classmethod
    def of(cls, r: GpuIdleResult | GpuIdleFailed | None) -> Gpus | None:
        """None where nvidia-smi was not read (the task did not run, or failed before)."""
        if r is None or r.gpus is None:
            return None
        return cls(r.idle, list(r.gpus), list(r.holders or []), list(r.busy or []), list(r.killed or []))

    def summary(self) -> dict[str, Any]:
        """{idle, busy} as reports and the ledger keep them, busy GPUs as the module listed them."""
        return {"idle": self.idle, "busy": [b.model_dump() for b in self.busy]}


@dataclass
class Probe:
    """What the host ran before this play (roles/sglang_probe), as far as its probe said: the
    fields of module_results.ProbeResult, each with a default where it said nothing (it failed early,
    or never ran)."""

    installed: bool = False
    digest: str = ""
    profile: str = ""
    unit: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    uptime_s: float | None = None
    restart_needed: bool = False
    reasons: list[str] = field(default_factory=list)
    healthy: bool = False
    #: The /health it asked (the plan's, else the one stored with the installed unit), and the
    #: answer: an HTTP status, or None when nothing answered or nothing was asked.
    health_url: str = ""
    health_status: int | None = None
    last_good: dict[str, Any] = field(default_factory=dict)
    locked: bool = False
    preflight: PreflightResult | None = None
    #: What it read into the page cache before the stop (sglang_probe's read_ahead).
    read_ahead: dict[str, Any] = field(default_factory=dict)
    #: What the play did next on the host, as the probe decided (module_results.ProbeResult).
    end_play: bool = False
    wait_health: bool = False
    record: bool = False
    release_run_id: str = ""
    release_on_failure: bool = False
    journal: bool = False

    @classmethod
    def of(cls, r: ProbeResult | ProbeFailed | None) -> Probe:
        if r is None:
            return cls()
        said = {name: getattr(r, name) for name in ProbeResult.model_fields}
        return cls(**{name: value for name, value in said.items() if value is not None})


@dataclass
class HostFacts:
    """Every result one host's play returned, typed (None: the task did not run)."""

    host: str
    probe: Probe
    preflight: PreflightResult | PreflightFailed | None
    stop: StopResult | StopFailed | None
    gpus: Gpus | None
    unit: UnitResult | UnitFailed | None
    health: HealthResult | HealthFailed | None
    started: bool
    failed: TaskEvent | None
    changed: bool
    elapsed_s: float
    #: Actions that finished (not skipped), in order.
    done: list[str]
    #: What the gateway and the server said at each step of a drain (gateway_steps()).
    gateway: dict[str, Any] = field(default_factory=dict)
    #: The play ended (Ctrl-C) while the host ran its restart transaction, which never came back.
    restarting: bool = False
    #: The hand-started server the restart's takeover step stopped first (sglang_adopt's
    #: takeover result); None: no takeover ran.
    takeover: AdoptResult | AdoptFailed | None = None

    @property
    def unreachable(self) -> bool:
        return self.failed is not None and self.failed.kind == "unreachable"

    @property
    def message(self) -> str:
        """Ansible's `msg` of the task that failed."""
        return self.failed.result.get("msg", "") if self.failed else ""

    @property
    def stopped(self) -> bool:
        """Whether this play stopped (or tried to stop) the host's server: then a rollback is owed.
        A stop that failed on busy GPUs did stop the server, and a restart that failed without
        saying which step (the host went, the module died) or never came back (Ctrl-C) may have."""
        if self.restarting or (self.takeover is not None and self.takeover.taken):
            return True
        return STOP in self.done or (self.failed is not None and self.failed.action in (STOP, RESTART, ADOPT))

    @property
    def problems(self) -> list[str]:
        own = self.preflight.problems if self.preflight else None
        return list(own or (self.probe.preflight.problems if self.probe.preflight else None) or [])


@dataclass
class UnitRun:
    """One unit of a play that reads every unit of a host (status.yml)."""

    name: str
    probe: Probe
    #: The lines its server logged that the play read (the journal of the probe's invocation).
    log: list[str]


def unit_runs(run: HostRun) -> list[UnitRun]:
    """Each unit sglang_units_info listed, in its order, with the probe its iteration ran (an
    include loop runs its items in order: the n-th probe is the n-th unit's; a unit the play
    never reached has an empty one) and the journal read for that probe's invocation."""
    listed = _as(_last_results(run).get(UNITS), UnitsInfoResult, UnitsInfoFailed)
    probes = [
        Probe.of(_as(typed(e), ProbeResult, ProbeFailed))
        for e in run.events
        if e.action == PROBE and e.kind in ("ok", "changed")
    ]
    # ansible.builtin.command's own result, Ansible's module: its `cmd` and `stdout`.
    logs = {
        arg.removeprefix("_SYSTEMD_INVOCATION_ID="): (e.result.get("stdout") or "").splitlines()
        for e in run.events
        if e.action == COMMAND and e.kind in ("ok", "changed")
        for arg in e.result.get("cmd") or []
        if isinstance(arg, str) and arg.startswith("_SYSTEMD_INVOCATION_ID=")
    }
    runs = []
    for i, name in enumerate((listed.units if listed else None) or []):
        probe = probes[i] if i < len(probes) else Probe()
        runs.append(UnitRun(name, probe, logs.get(probe.state.get("InvocationID") or "", [])))
    return runs


def _last_results(run: HostRun) -> dict[str, ModuleResult]:
    """{action: the typed result of the last finished task that ran it}, for orchestrator's
    modules; every one of their results is validated on the way, read or not."""
    last: dict[str, ModuleResult] = {}
    for e in run.events:
        r = typed(e)
        if r is not None:
            last[e.action] = r
    return last


def last_results(run: HostRun) -> dict[str, ModuleResult]:
    """{action: the typed result of the last finished task that ran it} (see _last_results)."""
    return _last_results(run)


def foreign_servers(run: HostRun) -> list[dict[str, Any]]:
    """The SGLang servers no orchestrator unit runs, as sglang_units_info listed them."""
    listed = _as(_last_results(run).get(UNITS), UnitsInfoResult, UnitsInfoFailed)
    return [s.model_dump() for s in (listed.foreign or [])] if listed is not None else []


def of_run(run: HostRun) -> HostFacts:
    last = _last_results(run)
    stop = _as(last.get(STOP), StopResult, StopFailed)
    waited = stop.gpus if stop is not None and isinstance(stop.gpus, GpuIdleResult) else None
    return HostFacts(
        host=run.host,
        probe=Probe.of(_as(last.get(PROBE), ProbeResult, ProbeFailed)),
        preflight=_as(last.get(PREFLIGHT), PreflightResult, PreflightFailed),
        stop=stop,
        gpus=Gpus.of(waited) or Gpus.of(_as(last.get(GPU_IDLE), GpuIdleResult, GpuIdleFailed)),
        unit=_as(last.get(UNIT), UnitResult, UnitFailed),
        health=_as(last.get(HEALTH), HealthResult, HealthFailed),
        started=START in last,
        failed=run.failed,
        changed=run.changed,
        elapsed_s=round((run.finished or time.monotonic()) - run.started, 1),
        done=[e.action for e in run.events if e.kind in ("ok", "changed")],
        gateway=gateway_steps(run),
        restarting=bool(run.events) and (run.events[-1].action, run.events[-1].kind) == (RESTART, "start"),
        takeover=_as(last.get(ADOPT), AdoptResult, AdoptFailed),
    )


def gateway_steps(run: HostRun) -> dict[str, Any]:
    """{out, drain, prove, back}: each step of a drain this host's play ran, with what the gateway
    listed before and after (out, back) or what the server said (drain, prove); {} without one."""
    found: dict[str, Any] = {}
    for e in run.events:
        r = typed(e) if e.action in (GATEWAY, DRAIN) else None
        if isinstance(r, GatewayResult | GatewayFailed):
            name = "out" if r.state == "absent" else "back"
            found[name] = {"changed": e.kind == "changed", "before": r.before, "after": r.after}
        elif isinstance(r, DrainResult | DrainFailed) and r.mode == "prove":
            name = "prove"
            found[name] = {"status": r.status, "waited_s": r.waited_s}
        elif isinstance(r, DrainResult | DrainFailed):
            name = "drain"
            found[name] = {"in_flight": r.in_flight, "waited_s": r.waited_s, "timed_out": r.timed_out}
        else:
            continue
        if e.kind in ("failed", "unreachable"):
            found[name]["error"] = e.result.get("msg", "")
    return found
