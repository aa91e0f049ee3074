"""The stop command's play: stop a unit and confirm its GPUs are released, per host.

Engine layer: never prints.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.hosts import readback
from orchestrator.hosts.host_report import HostReport, step
from orchestrator.hosts.playvars import PlayVars, Target
from orchestrator.hosts.runner import run_playbook


def stop(inventory: Path, *, unit_name: str = "sglang.service", limit: str | None = None) -> list[HostReport]:
    """Stop the unit and confirm the GPUs are released, per host."""
    play = run_playbook("stop.yml", inventory, PlayVars(target=Target(unit_name=unit_name)), limit=limit)
    reports = []
    for run in play.hosts.values():
        f = readback.of_run(run)
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
