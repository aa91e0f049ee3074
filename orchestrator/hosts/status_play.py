"""The status command's play: what each host runs now, one row per unit, read back typed.

Engine layer: never prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.hosts import readback
from orchestrator.hosts.logs_play import accept_from_log
from orchestrator.hosts.playvars import PlayVars, Target
from orchestrator.hosts.runner import run_playbook


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
    #: An SGLang server no orchestrator unit runs (started by hand: `adopt` takes it over): its
    #: {pid, user, started, ports, launcher, argv, log}; {} on a unit's row.
    foreign: dict[str, Any] = field(default_factory=dict)
    #: A PD fleet's server: {role, bootstrap_port, transfer_backend} from its unit's facts; {}: none.
    pd: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _health(probe: readback.Probe) -> int | None:
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
        f = readback.of_run(run)
        units = readback.unit_runs(run)
        foreign = [_foreign_row(f, s) for s in readback.foreign_servers(run)]
        rows += [_unit_row(f, u) for u in units] or ([] if foreign else [_host_row(f)])
        rows += foreign
    return sorted(rows, key=lambda r: (r.host, r.unit))


def _gpu_share(gpus: readback.Gpus | None, wanted: list[int]) -> tuple[int, list[dict[str, Any]]]:
    """(MiB used, holders) of the GPUs in `wanted` ([]: every GPU), out of one nvidia-smi read."""
    if gpus is None:
        return 0, []
    mine = [g for g in gpus.gpus if not wanted or g.index in wanted]
    holders = [h.model_dump() for h in gpus.holders if not wanted or h.gpu in wanted]
    return sum(g.memory_used_mib or 0 for g in mine), holders


def _unit_row(f: readback.HostFacts, u: readback.UnitRun) -> HostStatus:
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
        pd=dict(probe.facts.get("pd") or {}),
    )


def _host_row(f: readback.HostFacts) -> HostStatus:
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


#: The state of a row for a server started by hand.
FOREIGN = "started by hand"


def _foreign_row(f: readback.HostFacts, seen: dict[str, Any]) -> HostStatus:
    """An SGLang server on the host that no orchestrator unit runs: `adopt` writes its profile."""
    used, holders = _gpu_share(f.gpus, [])
    pid = int(seen.get("pid") or 0)
    launcher = seen.get("launcher") or {}
    ports = seen.get("ports") or []
    return HostStatus(
        host=f.host,
        reachable=True,
        profile="",
        digest="",
        active_state=f"{FOREIGN} ({launcher.get('kind') or '?'})",
        main_pid=pid,
        uptime_s=max(0.0, time.time() - float(seen.get("started") or time.time())),
        health=None,
        gpu_used_mib=used,
        gpu_holders=[h for h in holders if h.get("pid") == pid],
        port=ports[0] if ports else None,
        foreign=dict(seen),
    )
