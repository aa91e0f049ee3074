"""Facts in: each host's module results, picked by the module an event ran (its action).

A task's display name is for people; renaming one in YAML changes nothing here. The action
names are the modules in roles/*/library (see docs/architecture.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.runner import HostRun, TaskEvent

PROBE = "sglang_probe"
UNITS = "sglang_units_info"
PREFLIGHT = "sglang_preflight"
STOP = "sglang_stop"
GPU_IDLE = "gpu_idle"
UNIT = "sglang_unit"
START = "sglang_start"
HEALTH = "sglang_health_wait"
RECORD = "sglang_record"
GATEWAY = "sglang_gateway"
DRAIN = "sglang_drain"
COMMAND = "ansible.builtin.command"

#: Actions in play order, with the step name users see.
STEPS = {
    PROBE: "probe",
    PREFLIGHT: "preflight",
    GATEWAY: "gateway",
    DRAIN: "drain",
    STOP: "stop",
    GPU_IDLE: "GPUs idle",
    UNIT: "write unit",
    START: "start",
    HEALTH: "health",
    RECORD: "record",
}


def step_of(e: TaskEvent) -> str:
    """The step an event belongs to: a probe that failed on its preflight checks is `preflight`,
    a stop that failed on the GPUs is `GPUs idle`."""
    if e.action == PROBE and e.result.get("preflight", {}).get("problems"):
        return STEPS[PREFLIGHT]
    if e.action == STOP and e.kind == "failed" and (e.result.get("gpus") or {}).get("busy"):
        return STEPS[GPU_IDLE]
    if e.action == GATEWAY and e.result.get("state"):
        return "gateway out" if e.result["state"] == "absent" else "gateway back"
    if e.action == DRAIN and e.result.get("mode") == "prove":
        return "prove"
    return STEPS.get(e.action, "")


@dataclass
class Gpus:
    idle: bool | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    holders: list[dict[str, Any]] = field(default_factory=list)
    busy: list[dict[str, Any]] = field(default_factory=list)
    killed: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, result: dict[str, Any] | None) -> Gpus | None:
        if not result or "gpus" not in result:
            return None
        keys = ("gpus", "holders", "busy", "killed")
        return cls(result.get("idle"), *(list(result.get(k) or []) for k in keys))

    @property
    def used_mib(self) -> int:
        return sum(g.get("memory_used_mib") or 0 for g in self.gpus)


@dataclass
class Probe:
    """What the host ran before this play (roles/sglang_probe)."""

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
    preflight: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, result: dict[str, Any] | None) -> Probe:
        r = result or {}
        return cls(
            installed=bool(r.get("installed")),
            digest=r.get("digest", ""),
            profile=r.get("profile", ""),
            unit=r.get("unit", ""),
            facts=r.get("facts") or {},
            state=r.get("state") or {},
            uptime_s=r.get("uptime_s"),
            restart_needed=bool(r.get("restart_needed")),
            reasons=list(r.get("reasons") or []),
            healthy=bool(r.get("healthy")),
            health_url=r.get("health_url", ""),
            health_status=r.get("health_status"),
            last_good=r.get("last_good") or {},
            locked=bool(r.get("locked")),
            preflight=r.get("preflight") or {},
        )


@dataclass
class HostFacts:
    """Every result one host's play returned, typed."""

    host: str
    probe: Probe
    preflight: dict[str, Any]
    stop: dict[str, Any]
    gpus: Gpus | None
    unit: dict[str, Any]
    health: dict[str, Any]
    started: bool
    failed: TaskEvent | None
    changed: bool
    elapsed_s: float
    #: Actions that finished (not skipped), in order.
    done: list[str]
    #: What the gateway and the server said at each step of a drain (gateway_steps()).
    gateway: dict[str, Any] = field(default_factory=dict)

    @property
    def unreachable(self) -> bool:
        return self.failed is not None and self.failed.kind == "unreachable"

    @property
    def message(self) -> str:
        return self.failed.result.get("msg", "") if self.failed else ""

    @property
    def stopped(self) -> bool:
        """Whether this play stopped (or tried to stop) the host's server: then a rollback is owed.
        A stop that failed on busy GPUs did stop the server."""
        return STOP in self.done or (self.failed is not None and self.failed.action == STOP)

    @property
    def problems(self) -> list[str]:
        return list(self.preflight.get("problems") or self.probe.preflight.get("problems") or [])


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
    listed = (run.result_of(UNITS) or {}).get("units") or []
    probes = [Probe.of(e.result) for e in run.events if e.action == PROBE and e.kind in ("ok", "changed")]
    logs = {
        arg.removeprefix("_SYSTEMD_INVOCATION_ID="): (e.result.get("stdout") or "").splitlines()
        for e in run.events
        if e.action == COMMAND and e.kind in ("ok", "changed")
        for arg in e.result.get("cmd") or []
        if isinstance(arg, str) and arg.startswith("_SYSTEMD_INVOCATION_ID=")
    }
    runs = []
    for i, name in enumerate(listed):
        probe = probes[i] if i < len(probes) else Probe()
        runs.append(UnitRun(name, probe, logs.get(probe.state.get("InvocationID") or "", [])))
    return runs


def of_run(run: HostRun) -> HostFacts:
    probe = run.result_of(PROBE)
    stop = run.result_of(STOP) or {}
    gpus = Gpus.of(stop.get("gpus")) or Gpus.of(run.result_of(GPU_IDLE))
    return HostFacts(
        host=run.host,
        probe=Probe.of(probe),
        preflight=run.result_of(PREFLIGHT) or {},
        stop=stop,
        gpus=gpus,
        unit=run.result_of(UNIT) or {},
        health=run.result_of(HEALTH) or {},
        started=run.result_of(START) is not None,
        failed=run.failed,
        changed=run.changed,
        elapsed_s=round((run.finished or time.monotonic()) - run.started, 1),
        done=[e.action for e in run.events if e.kind in ("ok", "changed")],
        gateway=gateway_steps(run),
    )


def gateway_steps(run: HostRun) -> dict[str, Any]:
    """{out, drain, prove, back}: each step of a drain this host's play ran, with what the gateway
    listed before and after (out, back) or what the server said (drain, prove); {} without one."""
    found: dict[str, Any] = {}
    for e in run.events:
        if e.kind in ("start", "skipped") or e.action not in (GATEWAY, DRAIN):
            continue
        r = e.result
        if e.action == GATEWAY:
            name = "out" if r.get("state") == "absent" else "back"
            found[name] = {"changed": e.kind == "changed", "before": r.get("before"), "after": r.get("after")}
        else:
            name = "prove" if r.get("mode") == "prove" else "drain"
            keys = ("status", "waited_s") if name == "prove" else ("in_flight", "waited_s", "timed_out")
            found[name] = {k: r.get(k) for k in keys}
        if e.kind in ("failed", "unreachable"):
            found[name]["error"] = r.get("msg", "")
    return found
