"""The preflight command's play: every read-only check a deploy makes before it stops anything.

Engine layer: never prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.hosts import readback
from orchestrator.hosts.module_results import PreflightFailed
from orchestrator.hosts.playvars import PlayVars, for_profile, placements
from orchestrator.hosts.runner import run_playbook
from orchestrator.profile.model import Profile
from orchestrator.render import systemd_check


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
        f = readback.of_run(run)
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
