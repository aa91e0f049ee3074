"""status, stop and preflight: the plays besides deploy, each host's facts read back typed.

Engine layer: never prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import facts as facts_mod
from orchestrator import systemd_check
from orchestrator.hostplan import PlayVars, Target, for_profile, placements
from orchestrator.logs import accept_from_log
from orchestrator.profile import Profile
from orchestrator.report import HostReport, step
from orchestrator.results import PreflightFailed
from orchestrator.runner import run_playbook


@dataclass
class HostStatus:
    """One unit on one host (status), or the one row of a host without any."""

    host: str
    reachable: bool
    profile: str
    digest: str
    active_state: str
    main_pid: int
    uptime_s: float | None
    #: HTTP status of /health; -1: nothing answered; None: not asked (no unit, or not active).
    health: int | None
    gpu_used_mib: int
    gpu_holders: list[dict[str, Any]]
    message: str = ""
    #: Whether the installed unit runs speculative decoding.
    speculative: bool = False
    #: Mean `accept len` of the newest decode log lines of this start of the unit (None: none yet).
    accept_len: float | None = None
    #: The server's HTTP port, from the facts stored with its unit (None: none recorded).
    port: int | None = None
    #: The systemd unit; "" on the row of a host with no orchestrator unit.
    unit: str = ""
    #: The unit's GPU set (nvidia-smi indexes) from its stored facts, which gpu_used_mib and
    #: gpu_holders are about; [] when none are recorded: then they are about every GPU.
    gpus: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _health(probe: facts_mod.Probe) -> int | None:
    if not probe.health_url or probe.state.get("ActiveState") != "active":
        return None
    return probe.health_status if probe.health_status is not None else -1


#: The state of the one row of a host where orchestrator deployed no unit.
NO_UNIT = "no unit"


def status(inventory: Path, *, unit_name: str = "", limit: str | None = None) -> list[HostStatus]:
    """What each host runs now, one row per unit: every unit orchestrator deployed there (or
    `unit_name` alone; a host with none gets one row saying so): profile, digest, state,
    MainPID, uptime, health, the memory and holders of that unit's GPUs, and the accept length
    its server logs."""
    play = run_playbook("status.yml", inventory, PlayVars(target=Target(unit_name=unit_name)), limit=limit)
    rows = []
    for run in play.hosts.values():
        f = facts_mod.of_run(run)
        units = facts_mod.unit_runs(run)
        rows += [_unit_row(f, u) for u in units] or [_host_row(f)]
    return sorted(rows, key=lambda r: (r.host, r.unit))


def _gpu_share(gpus: facts_mod.Gpus | None, wanted: list[int]) -> tuple[int, list[dict[str, Any]]]:
    """(MiB used, holders) of the GPUs in `wanted` ([]: every GPU), out of one nvidia-smi read."""
    if gpus is None:
        return 0, []
    mine = [g for g in gpus.gpus if not wanted or g.index in wanted]
    holders = [h.model_dump() for h in gpus.holders if not wanted or h.gpu in wanted]
    return sum(g.memory_used_mib or 0 for g in mine), holders


def _unit_row(f: facts_mod.HostFacts, u: facts_mod.UnitRun) -> HostStatus:
    probe = u.probe
    active = probe.state.get("ActiveState") == "active"
    gpus = [int(i) for i in probe.facts.get("gpus") or []]
    used, holders = _gpu_share(f.gpus, gpus)
    return HostStatus(
        host=f.host,
        reachable=not f.unreachable,
        profile=probe.profile,
        digest=probe.digest,
        active_state=probe.state.get("ActiveState", "?"),
        main_pid=int(probe.state.get("MainPID", 0) or 0),
        uptime_s=probe.uptime_s,
        health=_health(probe),
        gpu_used_mib=used,
        gpu_holders=holders,
        message=f.message,
        speculative=bool(probe.facts.get("speculative")),
        accept_len=accept_from_log(u.log) if active else None,
        port=probe.facts.get("port"),
        unit=u.name,
        gpus=gpus,
    )


def _host_row(f: facts_mod.HostFacts) -> HostStatus:
    """A host with no orchestrator unit (or unreachable, or failed before listing them): what
    holds its GPUs, if the play got that far."""
    used, holders = _gpu_share(f.gpus, [])
    return HostStatus(
        host=f.host,
        reachable=not f.unreachable,
        profile="",
        digest="",
        active_state=NO_UNIT if f.failed is None else "?",
        main_pid=0,
        uptime_s=None,
        health=None,
        gpu_used_mib=used,
        gpu_holders=holders,
        message=f.message,
    )


def stop(inventory: Path, *, unit_name: str = "sglang.service", limit: str | None = None) -> list[HostReport]:
    """Stop the unit and confirm the GPUs are released, per host."""
    play = run_playbook("stop.yml", inventory, PlayVars(target=Target(unit_name=unit_name)), limit=limit)
    reports = []
    for run in play.hosts.values():
        f = facts_mod.of_run(run)
        reports.append(
            HostReport(
                host=run.host,
                ok=f.failed is None,
                step=step(f),
                changed=f.changed,
                message=f.message,
                gpus=f.gpus.summary() if f.gpus else {},
                elapsed_s=f.elapsed_s,
            )
        )
    return sorted(reports, key=lambda r: r.host)


@dataclass
class PreflightResult:
    host: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    #: What could not be checked yet without being a problem (an image the engine pulls at start).
    notes: list[str] = field(default_factory=list)
    sglang_version: str = ""
    gpus: int = 0
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def preflight(prof: Profile, inventory: Path, limit: str | None = None) -> list[PreflightResult]:
    """Every read-only check a deploy of this profile makes before stopping anything, on every host
    (a multi-node rank: its own flags and its share of the GPUs). The --help check always runs."""
    hosts = {}
    where = placements(prof, inventory, limit)
    systemd_check.require(prof, [p.plan for p in where.values()])  # systemd's reading, before any host
    for name, p in where.items():
        hp = for_profile(prof, p.plan, p.facts)
        checks = hp.preflight.model_copy(update={"skip_flags_if_digest": ""}) if hp.preflight else None
        hosts[name] = hp.model_copy(update={"preflight": checks})
    play = run_playbook("preflight.yml", inventory, PlayVars(hosts=hosts), limit=limit)
    results = []
    for run in play.hosts.values():
        f = facts_mod.of_run(run)
        res = f.preflight or PreflightFailed()  # the check never ran: nothing known
        problems = f.problems or ([f.message or "failed"] if f.failed else [])
        results.append(
            PreflightResult(
                host=run.host,
                ok=not problems,
                problems=problems,
                notes=list(res.notes or []),
                sglang_version=res.sglang_version or "",
                gpus=res.gpus or 0,
                elapsed_s=f.elapsed_s,
            )
        )
    return sorted(results, key=lambda r: r.host)
