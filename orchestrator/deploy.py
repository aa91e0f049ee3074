"""deploy, status and stop: a Plan carried out on hosts by playbooks, results read back per host.

Engine layer: never prints. `deploy()` returns a `DeployReport`; the CLI shows it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import plan as plan_mod
from orchestrator import profile as profile_mod
from orchestrator.errors import InputError
from orchestrator.plan import Plan
from orchestrator.runner import HostRun, PlayResult, TaskEvent, run_playbook

#: Roles in play order, with the step name users see.
STEPS = {
    "sglang_probe": "probe",
    "sglang_stop": "stop",
    "gpu_idle": "GPUs idle",
    "sglang_unit": "write unit",
    "sglang_service": "start",
    "sglang_health": "health",
}


@dataclass
class HostReport:
    """What happened on one host, in the words a user needs."""

    host: str
    ok: bool
    changed: bool
    restarted: bool
    healthy_after_s: float | None
    digest: str
    previous_digest: str
    step: str
    message: str = ""
    reasons: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    diff: str = ""
    previous_unit: str = ""
    gpus: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class DeployReport:
    profile: str
    digest: str
    check: bool
    hosts: list[HostReport]
    artifacts: str

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
            "hosts": [h.to_json() for h in self.hosts],
        }


def health_url(plan: Plan, host: str) -> str:
    """/health as seen from the host itself: a wildcard bind is reached on loopback."""
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in target:
        target = f"[{target}]"
    return f"http://{target}:{plan.port}{plan.health_path}"


def _secret_config(prof: profile_mod.Profile) -> str:
    """The --config YAML holding the API key, read from the control machine's file or variable."""
    ref = prof.api_key
    if ref is None:
        return ""
    if ref.file:
        path = Path(ref.file).expanduser()
        if not path.is_file():
            raise InputError(f"api_key.file: {path} does not exist on this machine")
        key = path.read_text().strip()
    else:
        key = os.environ.get(ref.env or "", "")
        if not key:
            raise InputError(f"api_key.env: ${ref.env} is not set on this machine")
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'api-key: "{escaped}"\n'


def extravars(prof: profile_mod.Profile, plan: Plan, secret: str, force_restart: bool) -> dict[str, Any]:
    gpus = list(range(prof.server.tp_size * prof.server.dp_size))
    return {
        "orch_plan": {
            "profile": plan.profile,
            "unit_name": plan.unit_name,
            "unit": plan.unit,
            "digest": plan.digest,
            "secret_path": plan.secret_path or "",
            "secret_sha1": hashlib.sha1(secret.encode()).hexdigest() if secret else "",
            "health_url": health_url(plan, prof.server.host),
            "health_timeout_s": prof.service.health_timeout_s,
            "health_interval_s": prof.service.health_poll_interval_s,
            "gpus": gpus,
            "gpu_release_timeout_s": 30,
        },
        "orch_force_restart": force_restart,
    }


def _host_report(run: HostRun, plan: Plan, check: bool) -> HostReport:
    probe = run.result_of("sglang_probe") or {}
    health = run.result_of("sglang_health") or {}
    unit = run.result_of("sglang_unit", "Write the unit") or {}
    gpus = run.result_of("gpu_idle") or {}
    failed = run.failed
    restart_needed = bool(probe.get("restart_needed"))
    noop_healthy = not restart_needed and bool(probe.get("healthy"))
    last = next((e for e in reversed(run.events) if e.kind != "skipped"), None)
    step = STEPS.get(failed.role if failed else (last.role if last else ""), "connect")
    diff = ""
    for d in unit.get("diff", []) if isinstance(unit.get("diff"), list) else []:
        diff += d.get("prepared", "") or _unified(d)
    return HostReport(
        host=run.host,
        ok=failed is None and (check or health.get("reason") == "healthy" or noop_healthy),
        changed=run.changed,
        restarted=restart_needed and not check and failed is None,
        healthy_after_s=_healthy_after(health, noop_healthy),
        digest=plan.digest if (restart_needed and not check and failed is None) else probe.get("digest", ""),
        previous_digest=probe.get("digest", ""),
        step=step,
        message=(failed.result.get("msg", "") if failed else ""),
        reasons=probe.get("reasons", []),
        journal=health.get("journal", []) if failed else [],
        diff=diff,
        previous_unit=probe.get("unit", ""),
        gpus={"idle": gpus.get("idle"), "busy": gpus.get("busy", [])} if gpus else {},
        elapsed_s=round((run.finished or time.monotonic()) - run.started, 1),
    )


def _healthy_after(health: dict[str, Any], noop_healthy: bool) -> float | None:
    """Seconds from start to healthy; 0 for a server that was healthy and left alone."""
    if health.get("reason") == "healthy":
        return health["elapsed_s"]
    return 0.0 if noop_healthy else None


def _unified(d: dict[str, Any]) -> str:
    import difflib

    before, after = d.get("before", ""), d.get("after", "")
    if not isinstance(before, str) or not isinstance(after, str):
        return ""
    lines = difflib.unified_diff(
        before.splitlines(True),
        after.splitlines(True),
        d.get("before_header", "a"),
        d.get("after_header", "b"),
    )
    return "".join(lines)


def deploy(
    profile_ref: str,
    inventory: Path,
    *,
    limit: str | None = None,
    check: bool = False,
    force_restart: bool = False,
    on_event: Callable[[TaskEvent], None] | None = None,
) -> DeployReport:
    """Validate, plan, run playbooks/deploy.yml, and report per host."""
    prof = profile_mod.load(profile_ref)
    plan = plan_mod.build(prof)
    secret = _secret_config(prof)
    play: PlayResult = run_playbook(
        "deploy.yml",
        inventory,
        extravars(prof, plan, secret, force_restart),
        limit=limit,
        check=check,
        env={"ORCH_SECRET_CONFIG": secret},
        on_event=on_event,
    )
    if not play.hosts:
        raise InputError(f"no host of {inventory} matched{f' --limit {limit}' if limit else ''}")
    reports = [_host_report(run, plan, check) for run in play.hosts.values()]
    return DeployReport(
        prof.name, plan.digest, check, sorted(reports, key=lambda r: r.host), str(play.artifacts)
    )


@dataclass
class HostStatus:
    host: str
    reachable: bool
    profile: str
    digest: str
    active_state: str
    main_pid: int
    uptime_s: float | None
    health: int | None
    gpu_used_mib: int
    gpu_holders: list[dict[str, Any]]
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def status(
    inventory: Path, *, unit_name: str = "sglang.service", limit: str | None = None
) -> list[HostStatus]:
    """What each host runs now: profile, digest, unit state, MainPID, uptime, health, GPU memory."""
    play = run_playbook("status.yml", inventory, {"orch_unit_name": unit_name}, limit=limit)
    rows = []
    for run in play.hosts.values():
        probe = run.result_of("sglang_probe") or {}
        gpus = run.result_of("gpu_idle") or {}
        health = next((e.result for e in run.events if e.task == "Ask /health" and e.kind != "start"), {})
        state = probe.get("state", {})
        failed = run.failed
        rows.append(
            HostStatus(
                host=run.host,
                reachable=not (failed and failed.kind == "unreachable"),
                profile=probe.get("profile", ""),
                digest=probe.get("digest", ""),
                active_state=state.get("ActiveState", "?"),
                main_pid=int(state.get("MainPID", 0) or 0),
                uptime_s=probe.get("uptime_s"),
                health=health.get("status") if health and not health.get("skipped") else None,
                gpu_used_mib=sum(g["memory_used_mib"] for g in gpus.get("gpus", [])),
                gpu_holders=gpus.get("holders", []),
                message=failed.result.get("msg", "") if failed else "",
            )
        )
    return sorted(rows, key=lambda r: r.host)


def stop(inventory: Path, *, unit_name: str = "sglang.service", limit: str | None = None) -> list[HostReport]:
    """Stop the unit and confirm the GPUs are released, per host."""
    play = run_playbook("stop.yml", inventory, {"orch_unit_name": unit_name}, limit=limit)
    reports = []
    for run in play.hosts.values():
        failed = run.failed
        last = next((e for e in reversed(run.events) if e.kind != "skipped"), None)
        gpus = run.result_of("gpu_idle") or {}
        reports.append(
            HostReport(
                host=run.host,
                ok=failed is None,
                changed=run.changed,
                restarted=False,
                healthy_after_s=None,
                digest="",
                previous_digest="",
                step=STEPS.get(failed.role if failed else (last.role if last else ""), "connect"),
                message=failed.result.get("msg", "") if failed else "",
                gpus={"idle": gpus.get("idle"), "busy": gpus.get("busy", [])} if gpus else {},
                elapsed_s=round((run.finished or time.monotonic()) - run.started, 1),
            )
        )
    return sorted(reports, key=lambda r: r.host)
