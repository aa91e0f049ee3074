"""deploy --canary: one host first, benched before and after, and the rest only if it is not slower.

A profile that starts fine can still be slower: a drafter that does not help, or graphs off. The
canary catches that on one replica. It puts that replica back when the profile is rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import ledger
from orchestrator.errors import InputError, OrchestratorError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts import rotation
from orchestrator.hosts.host_report import DeployReport
from orchestrator.hosts.inventory import selected
from orchestrator.hosts.playvars import GatewayPlan, multinode_hosts, placements
from orchestrator.hosts.rollback import rollback
from orchestrator.hosts.runner import TaskEvent
from orchestrator.hosts.secrets import api_key
from orchestrator.profile.model import Profile
from orchestrator.tuning import bench as bench_mod


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


def _out_of_rotation(
    prof: Profile, inventory: Path, host: str, options: deploy_mod.Options
) -> tuple[GatewayPlan, str] | None:
    """Behind a gateway, the canary leaves its rotation and drains before it is benched, so the bench
    measures it alone; (its gateway, the admin key), or None without one (or with --no-drain)."""
    where = placements(prof, inventory, host)
    gw = deploy_mod.gateways(where, options).get(host)
    if gw is None or options.check:
        return None
    key = rotation.api_keys(inventory, [host]).get(host, "")
    rotation.check({host: gw}, {host: key})
    try:
        if rotation.client.remove(gw.url, gw.worker_url, key, gw.add_timeout_s) is not None:
            target = bench_mod.find_target(inventory, host, prof)
            rotation.client.drain(target.url, target.api_key, gw.drain_timeout_s)
    except rotation.client.GatewayError as exc:
        raise OrchestratorError(f"{host}: taking the canary out of rotation: {exc}") from None
    return gw, key


def _rejoin(prof: Profile, host: str, gw: GatewayPlan, key: str) -> str:
    """The canary back in its gateway's rotation; "" once listed healthy, else why it stays out."""
    try:
        rotation.client.add(gw.url, gw.worker_url, key, api_key(prof) or "", gw.add_timeout_s)
    except rotation.client.GatewayError as exc:
        return f"the canary is LEFT OUT of the gateway's rotation: {exc}"
    return ""


def _try(
    prof: Profile,
    inventory: Path,
    host: str,
    options: deploy_mod.Options,
    margin: float,
    settings: bench_mod.Settings,
    on_event: Callable[[TaskEvent], None] | None,
) -> tuple[Canary, DeployReport]:
    """The canary's own deploy and its benches before and after (a slower one rolled back)."""
    try:
        before = _tok_s(inventory, host, settings, None)
    except bench_mod.BenchError:
        before = None  # nothing served there yet: nothing to compare against
    first = deploy_mod.deploy(prof, inventory, replace(options, limit=host, rejoin=False), on_event)
    if not first.ok:
        return Canary(host, before, None, margin, False, "the canary deploy failed"), first
    after = _tok_s(inventory, host, settings, prof)
    if before and after is not None and after < before * (1 - margin):
        rollback(inventory, limit=host, on_event=on_event)
        why = f"{after:.1f} tok/s is more than {margin:.0%} below the previous {before:.1f} tok/s"
        why += "; canary rolled back, no other host touched"
        return Canary(host, before, after, margin, False, why), first
    return Canary(host, before, after, margin, True, "tok/s held up"), first


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
    if not options.check:  # before the canary leaves its gateway: every bench and deploy is recorded
        ledger.ready()
    hosts = [h.name for h in selected(inventory, options.limit)]
    host, rest = hosts[0], hosts[1:]
    if rest and options.preflight and not options.files_checked:
        # the canary's files must be the fleet's, or its bench says nothing of theirs
        deploy_mod.same_files(prof, inventory, placements(prof, inventory, options.limit))
        options = replace(options, files_checked=True)
    out = _out_of_rotation(prof, inventory, host, options)
    try:
        canary, first = _try(prof, inventory, host, options, margin, settings, on_event)
    finally:  # benched out of rotation: back in (healthy) before anything else, even on Ctrl-C
        left_out = _rejoin(prof, host, *out) if out is not None else ""
    if left_out:
        canary.accepted, canary.reason = False, f"{canary.reason}; {left_out}"
    if not canary.accepted:
        return canary, first
    if not rest:
        return canary, first
    others = deploy_mod.deploy(prof, inventory, replace(options, limit=",".join(rest)), on_event)
    merged = replace(others, hosts=sorted(first.hosts + others.hosts, key=lambda r: r.host))
    return canary, merged
