"""Rollback: a host back on a recorded healthy unit, with the facts recorded beside it.

No unit text is parsed. The port, GPUs and health URL of a recorded unit are its `UnitFacts`. They
are kept in the host's last-good record and in the ledger.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import ledger
from orchestrator.hosts import playvars, readback
from orchestrator.hosts.host_report import DeployReport, HostReport, host_report
from orchestrator.hosts.playvars import GatewayPlan, HostPlan, PlayVars
from orchestrator.hosts.runner import TaskEvent, run_playbook
from orchestrator.hosts.status_play import status

#: How long a rollback waits for another deploy's lock on a host.
LOCK_WAIT_S = 120


def record(run_id: str, r: HostReport, hp: HostPlan, action: str) -> None:
    """One ledger row; a healthy host's unit (with its facts) becomes its last known good."""
    result = ("healthy" if r.restarted else "unchanged") if r.ok else "failed"
    row = ledger.DeployRow(
        run_id=run_id,
        host=r.host,
        unit_name=hp.unit_name,
        profile=hp.profile,
        digest=hp.digest,
        action=action,
        result=result,
        restarted=r.restarted,
        duration_s=r.elapsed_s,
        diagnosis=r.diagnosis,
        model=hp.facts.model,
        phases=r.phases if r.restarted else [],
        model_digest=r.model_digest,
        memory=r.memory if r.restarted else {},
    )
    good = hp.unit if r.ok else None
    ledger.record_deploy(row, good_unit=good, facts=hp.facts.model_dump() if good else None)


def _target(r: HostReport, good: dict[str, Any] | None, failed_digest: str) -> str:
    """Why `good` cannot be rolled back to, or "" when it can."""
    if not good:
        return "no last known good recorded for this host"
    if good["digest"] == failed_digest:
        return f"the last known good is the unit that just failed ({failed_digest})"
    if not good.get("facts"):
        return (
            f"the last known good ({good['profile']}, {good['digest']}) was recorded before orchestrator "
            "kept a unit's facts (port, GPUs, health URL): deploy that profile instead"
        )
    try:
        playvars.UnitFacts.model_validate(good["facts"])
    except ValidationError as exc:  # a record edited by hand
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return (
            f"the facts recorded with the last known good ({good['profile']}, {good['digest']}) cannot be "
            f"read ({where}: {first['msg']}): deploy that profile instead"
        )
    return ""


def rollback_hosts(
    inventory: Path,
    reports: list[HostReport],
    unit_name: str,
    health_timeout_s: int,
    run_id: str,
    failed: dict[str, str] | None = None,
    on_event: Callable[[TaskEvent], None] | None = None,
    prefer_record: bool = False,
    gateways: dict[str, GatewayPlan] | None = None,
    secret: str = "",
    *,
    lock_id: str | None = None,
    keep_lock: bool = False,
    lock_profile: str | None = None,
) -> dict[str, HostReport]:
    """Restore each host's last known good unit (the host's own record, else the ledger's), start
    it, wait for health. `failed` maps a host to the digest that just failed there, never restored.
    A host behind a gateway (`gateways`) goes back into its rotation once healthy and generating;
    `secret` (the deploy's bundle) gives the server's API key for that.
    The host lock is taken under `lock_id` (None: `run_id`), named `lock_profile` (None: the
    restored unit's profile), and left held with `keep_lock`: a campaign's deploy rolls back
    under the campaign's lock and keeps it.
    Fills in `rolled_back_to` or `rollback_error` on each report, and returns the rollback's own
    report per host it ran on."""
    goods: dict[str, dict[str, Any]] = {}
    for r in reports:
        good = r.last_good if prefer_record else _good_unit(r, unit_name)
        r.rollback_error = _target(r, good, (failed or {}).get(r.host, ""))
        if good and not r.rollback_error:
            goods[r.host] = good
    if not goods:  # every healthy deploy ends here: no lock (a scan of /proc) to build
        return {}
    lock = playvars.lock(lock_id or run_id, "rollback", health_timeout_s + 300, LOCK_WAIT_S, keep=keep_lock)
    plans: dict[str, HostPlan] = {
        host: playvars.for_record(
            unit_name,
            good,
            lock=lock.model_copy(update={"profile": lock_profile or good["profile"]}),
            health_timeout_s=health_timeout_s,
            gateway=(gateways or {}).get(host),
        )
        for host, good in goods.items()
    }
    play = run_playbook(
        "deploy.yml",
        inventory,
        PlayVars(hosts=plans),
        limit=",".join(plans),
        secret=secret if any(p.gateway for p in plans.values()) else "",
        on_event=on_event,
    )
    runs: dict[str, HostReport] = {}
    for r in reports:
        hp = plans.get(r.host)
        run = play.hosts.get(r.host) if hp else None
        if hp is None:
            continue
        if run is None:
            r.rollback_error = "host not reached"
            continue
        done = runs[r.host] = host_report(readback.of_run(run), hp.digest, hp.unit, False)
        record(run_id, done, hp, "rollback")
        if done.ok:
            r.rolled_back_to = f"{hp.profile} ({hp.digest})"
        else:
            r.rollback_error = done.diagnosis
    return runs


def _good_unit(r: HostReport, unit_name: str) -> dict[str, Any] | None:
    """After a failed deploy: the host's own last-good record, else the ledger's."""
    if r.last_good.get("unit"):
        return r.last_good
    return ledger.good_unit(r.host, unit_name)


def rollback(
    inventory: Path,
    unit_name: str = "sglang.service",
    limit: str | None = None,
    to_profile: str | None = None,
    on_event: Callable[[TaskEvent], None] | None = None,
) -> DeployReport:
    """On demand: each host back to its previous healthy unit (or PROFILE's last healthy one)."""
    ledger.ready()
    run_id = uuid.uuid4().hex[:12]
    reports = []
    for row in status(inventory, unit_name=unit_name, limit=limit):
        r = HostReport(
            host=row.host, ok=False, step="rollback", digest=row.digest, previous_digest=row.digest
        )
        if not row.reachable:
            r.rollback_error = row.message or "unreachable"
        else:
            good = ledger.good_unit(row.host, unit_name, to_profile) if to_profile else None
            good = good or (None if to_profile else ledger.previous_good(row.host, unit_name, row.digest))
            if good is None:
                r.rollback_error = f"no healthy {to_profile or 'earlier'} unit recorded for this host"
            else:
                r.last_good = good
        reports.append(r)
    todo = [r for r in reports if r.last_good]
    runs = rollback_hosts(inventory, todo, unit_name, 1800, run_id, None, on_event, prefer_record=True)
    for r in reports:
        r.ok = bool(r.rolled_back_to)
        done = runs.get(r.host)
        if done:  # this report is the rollback itself: show what it did to the host
            r.changed, r.restarted, r.digest = done.changed, done.restarted, done.digest
            r.healthy_after_s, r.elapsed_s, r.journal = done.healthy_after_s, done.elapsed_s, done.journal
    title = f"rollback{f' to {to_profile}' if to_profile else ''}"
    return DeployReport(title, "", False, reports, "", run_id, rollback=True)
