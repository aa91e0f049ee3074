"""deploy --canary: one host first, benched before and after; the rest only if it is not slower.

A profile that starts fine can still be slower (a drafter that does not help, graphs off);
the canary catches that on one replica, and puts that replica back when it is rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import bench as bench_mod
from orchestrator import deploy as deploy_mod
from orchestrator.errors import InputError
from orchestrator.hostplan import multinode_hosts
from orchestrator.inventory import selected
from orchestrator.profile import Profile
from orchestrator.report import DeployReport
from orchestrator.rollback import rollback
from orchestrator.runner import TaskEvent


@dataclass
class Canary:
    host: str
    before_tok_s: float | None
    after_tok_s: float | None
    margin: float
    accepted: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _tok_s(inventory: Path, host: str, settings: bench_mod.Settings, prof: Profile | None) -> float | None:
    target = bench_mod.find_target(inventory, host, prof)
    result = bench_mod.run(target, settings)
    bench_mod.record(result)
    return result.tok_s.mean


def canary_deploy(
    prof: Profile,
    inventory: Path,
    options: deploy_mod.Options,
    margin: float,
    settings: bench_mod.Settings,
    on_event: Callable[[TaskEvent], None] | None = None,
) -> tuple[Canary, DeployReport]:
    """Deploy and bench the first selected host; roll out to the others only if tok/s held up."""
    ranks = multinode_hosts(prof, inventory, options.limit)
    if ranks:
        raise InputError(
            "--canary tries one replica of a fleet first; a multi-node server "
            f"({', '.join(h.name for h in ranks)}) is one server: deploy it without --canary"
        )
    hosts = [h.name for h in selected(inventory, options.limit)]
    host, rest = hosts[0], hosts[1:]
    try:
        before = _tok_s(inventory, host, settings, None)
    except bench_mod.BenchError:
        before = None  # nothing served there yet: nothing to compare against
    first = deploy_mod.deploy(prof, inventory, replace(options, limit=host), on_event)
    if not first.ok:
        return Canary(host, before, None, margin, False, "the canary deploy failed"), first
    after = _tok_s(inventory, host, settings, prof)
    if before and after is not None and after < before * (1 - margin):
        rollback(inventory, limit=host, on_event=on_event)
        why = f"{after:.1f} tok/s is more than {margin:.0%} below the previous {before:.1f} tok/s"
        why += "; canary rolled back, no other host touched"
        return Canary(host, before, after, margin, False, why), first
    canary = Canary(host, before, after, margin, True, "tok/s held up")
    if not rest:
        return canary, first
    others = deploy_mod.deploy(prof, inventory, replace(options, limit=",".join(rest)), on_event)
    merged = replace(others, hosts=sorted(first.hosts + others.hosts, key=lambda r: r.host))
    return canary, merged
