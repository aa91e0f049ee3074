"""deploy, status and stop: a Plan carried out on hosts by playbooks, results read back per host.

Engine layer: never prints. `deploy()` returns a `DeployReport`; the CLI shows it.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import inventory as inventory_mod
from orchestrator import ledger
from orchestrator import plan as plan_mod
from orchestrator import profile as profile_mod
from orchestrator.diagnose import classify
from orchestrator.errors import InputError
from orchestrator.plan import Plan
from orchestrator.runner import HostRun, PlayCanceled, PlayResult, TaskEvent, run_playbook

#: Roles in play order, with the step name users see.
STEPS = {
    "sglang_preflight": "preflight",
    "sglang_probe": "probe",
    "sglang_stop": "stop",
    "gpu_idle": "GPUs idle",
    "sglang_unit": "write unit",
    "sglang_service": "start",
    "sglang_health": "health",
    "sglang_record": "record",
}

#: How long a second deploy waits for a host's lock before failing, naming the holder.
LOCK_WAIT_S = 120


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
    diagnosis: str = ""
    killed: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Whether this run stopped the host's server (only then is a rollback owed).
    stopped: bool = False
    #: Whether this run took the host's deploy lock (it was about to change the host).
    locked: bool = False
    #: When the server process exited during the health wait (systemd's realtime stamp), if it did.
    exited_at: str = ""
    last_good: dict[str, Any] = field(default_factory=dict)
    rolled_back_to: str = ""
    rollback_error: str = ""

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.pop("last_good")  # its unit text is in the ledger; keep the JSON readable
        return data


@dataclass
class DeployReport:
    profile: str
    digest: str
    check: bool
    hosts: list[HostReport]
    artifacts: str
    run_id: str = ""
    #: Ctrl-C (or SIGTERM) stopped it; hosts it had changed were rolled back.
    interrupted: bool = False

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
            "run_id": self.run_id,
            "interrupted": self.interrupted,
            "hosts": [h.to_json() for h in self.hosts],
        }


def health_url(plan: Plan, host: str) -> str:
    """/health as seen from the host itself: a wildcard bind is reached on loopback."""
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in target:
        target = f"[{target}]"
    return f"http://{target}:{plan.port}{plan.health_path}"


def api_key(prof: profile_mod.Profile) -> str:
    """The profile's API key, read from the control machine's file or variable ("" if none)."""
    ref = prof.api_key
    if ref is None:
        return ""
    if ref.file:
        path = Path(ref.file).expanduser()
        if not path.is_file():
            raise InputError(f"api_key.file: {path} does not exist on this machine")
        return path.read_text().strip()
    key = os.environ.get(ref.env or "", "")
    if not key:
        raise InputError(f"api_key.env: ${ref.env} is not set on this machine")
    return key


def _secret_config(prof: profile_mod.Profile) -> str:
    """The --config YAML holding the API key, for SGLang to read on the host."""
    key = api_key(prof)
    if not key:
        return ""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'api-key: "{escaped}"\n'


def plan_vars(
    plan: Plan, *, bind: str, health_timeout_s: int, interval_s: float, gpus: list[int], secret: str = ""
) -> dict[str, Any]:
    """One host's plan as the playbook's `orch_plan` / `orch_plans[host]`."""
    return {
        "profile": plan.profile,
        "unit_name": plan.unit_name,
        "unit": plan.unit,
        "digest": plan.digest,
        "secret_path": plan.secret_path or "",
        "secret_sha1": hashlib.sha1(secret.encode()).hexdigest() if secret else "",
        "health_url": health_url(plan, bind),
        "health_timeout_s": health_timeout_s,
        "health_interval_s": interval_s,
        "gpus": gpus,
        "gpu_release_timeout_s": 30,
    }


def profile_plan_vars(prof: profile_mod.Profile, plan: Plan, secret: str) -> dict[str, Any]:
    svc = prof.service
    gpus = list(range(prof.server.tp_size * prof.server.dp_size))
    return plan_vars(
        plan,
        bind=prof.server.host,
        health_timeout_s=svc.health_timeout_s,
        interval_s=svc.health_poll_interval_s,
        gpus=gpus,
        secret=secret,
    )


def unit_plan_vars(unit_name: str, profile: str, unit: str, health_timeout_s: int) -> dict[str, Any]:
    """A plan rebuilt from a recorded unit text (for rollback): port, bind and GPUs from its argv."""
    argv, env = plan_mod.parse_unit(unit)
    flags = plan_mod.flags_of(argv)
    tp = int(flags.get("--tp-size") or flags.get("--tensor-parallel-size") or 1)
    dp = int(flags.get("--dp-size") or flags.get("--data-parallel-size") or 1)
    recorded = Plan(
        profile=profile,
        sglang_version="",
        unit_name=unit_name,
        argv=argv,
        environment=env,
        unit=unit,
        port=int(flags.get("--port", 30000)),
    )
    bind = flags.get("--host", "127.0.0.1")
    nnodes = int(flags.get("--nnodes") or 1)
    vars_ = plan_vars(
        recorded,
        bind=bind,
        health_timeout_s=health_timeout_s,
        interval_s=0.25,
        gpus=list(range(tp * dp // nnodes)),
    )
    if nnodes > 1:  # every rank of a multi-node server waits on rank 0's endpoint
        rank0 = flags.get("--dist-init-addr", "127.0.0.1").rsplit(":", 1)[0].strip("[]")
        vars_["health_url"] = health_url(recorded, rank0)
    return vars_


def preflight_vars(prof: profile_mod.Profile, plan: Plan) -> dict[str, Any]:
    """What the host must offer for this plan (roles/sglang_preflight)."""
    s, spec = prof.server, prof.speculative
    return {
        "python": s.python,
        "sglang_version": s.sglang_version,
        "flags": sorted({a.split("=", 1)[0] for a in plan.argv[3:] if a.startswith("--")}),
        "model_path": s.model_path,
        "draft_model_path": spec.draft_model_path or "",
        "algorithm": spec.algorithm or "",
        "gpus_needed": s.tp_size * s.dp_size,
        "port": s.port,
        "unit_name": plan.unit_name,
    }


#: (host, plan digest) pairs that passed preflight in this process: a sweep's repeats skip them.
_PREFLIGHT_PASSED: set[tuple[str, str]] = set()


def _lock(run_id: str, ttl_s: float, wait_s: float) -> dict[str, Any]:
    who = f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"
    return {
        "holder": who,
        "run_id": run_id,
        "ttl_s": ttl_s,
        "wait_s": wait_s,
        "control": socket.gethostname(),
        "pid": os.getpid(),
        "live_pids": _live_pids(),
    }


def _live_pids() -> list[int]:
    """PIDs running on this machine: a lock taken from here by any other PID belongs to a
    deploy that died (killed, crashed) and may be taken over."""
    return sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())


def _host_report(run: HostRun, digest: str, check: bool) -> HostReport:
    probe = run.result_of("sglang_probe", "Read") or {}
    health = run.result_of("sglang_health") or {}
    unit = run.result_of("sglang_unit", "Write the unit") or {}
    gpus = run.result_of("gpu_idle") or {}
    failed = run.failed
    restart_needed = bool(probe.get("restart_needed"))
    noop_healthy = not restart_needed and bool(probe.get("healthy"))
    step = _step(run)
    diff = ""
    for d in unit.get("diff", []) if isinstance(unit.get("diff"), list) else []:
        diff += d.get("prepared", "") or _unified(d)
    report = HostReport(
        host=run.host,
        ok=failed is None and (check or health.get("reason") == "healthy" or noop_healthy),
        changed=run.changed,
        restarted=restart_needed and not check and failed is None,
        healthy_after_s=_healthy_after(health, noop_healthy),
        digest=digest if (restart_needed and not check and failed is None) else probe.get("digest", ""),
        previous_digest=probe.get("digest", ""),
        step=step,
        message=(failed.result.get("msg", "") if failed else ""),
        reasons=probe.get("reasons", []),
        journal=health.get("journal", []) if failed else [],
        diff=diff,
        previous_unit=probe.get("unit", ""),
        gpus={"idle": gpus.get("idle"), "busy": gpus.get("busy", [])} if gpus else {},
        elapsed_s=round((run.finished or time.monotonic()) - run.started, 1),
        killed=[k for e in run.events if e.role == "gpu_idle" for k in e.result.get("killed", [])],
        last_good=probe.get("last_good") or {},
    )
    report.exited_at = (health.get("unit_state") or {}).get("ExecMainExitTimestamp", "") if failed else ""
    report.stopped = any(e.role == "sglang_stop" and e.kind in ("ok", "changed") for e in run.events)
    report.locked = bool(probe.get("locked"))
    preflight = run.result_of("sglang_preflight", "Check") or {}
    report.problems = preflight.get("problems", [])
    if failed:
        report.diagnosis = _diagnosis(report, health)
    return report


def _step(run: HostRun) -> str:
    """The step a host failed at, or the last it did; `connect` when it was never reached."""
    failed = run.failed
    if failed and failed.kind == "unreachable":
        return "connect"
    last = next((e for e in reversed(run.events) if _is_step(e)), None)
    return STEPS.get(failed.role if failed else (last.role if last else ""), "connect")


def _is_step(e: TaskEvent) -> bool:
    """A task that moved the host along (not an argument check, a skip or the lock release)."""
    return e.kind != "skipped" and e.role in STEPS and not e.task.startswith(("Validating", "Release"))


def _diagnosis(report: HostReport, health: dict[str, Any]) -> str:
    if report.step == "preflight" and report.problems:
        return f"preflight: {len(report.problems)} problem(s), nothing was stopped: " + "; ".join(
            report.problems
        )
    if report.step == "health" and health:
        return str(classify(report.journal, health.get("unit_state"), health.get("reason", "")))
    first = report.message.strip().splitlines()[0] if report.message.strip() else "no message"
    return f"failed at {report.step}: {first}"


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


@dataclass(frozen=True)
class Options:
    """How a deploy behaves on hosts; the defaults are the safe ones."""

    limit: str | None = None
    check: bool = False
    force_restart: bool = False
    rollback: bool = True
    kill_gpu_holders: bool = False
    lock_wait_s: float = LOCK_WAIT_S
    #: Hosts per batch ("2" or "25%"); None: all at once.
    serial: str | None = None
    #: Stop starting new batches once more than this percent of a batch failed.
    max_fail_percent: int | None = None
    #: Run the read-only checks before a restart (off only to provoke or debug a failing start).
    preflight: bool = True


def multinode_hosts(prof: profile_mod.Profile, inventory: Path, limit: str | None) -> list[Any] | None:
    """The ranks of a multi-node server, in inventory order; None for a fleet of replicas.

    The kind comes from the profile, or from the hosts' `orchestrator_deployment` variable.
    """
    selected = inventory_mod.hosts(inventory, limit)
    kinds = {h.deployment or prof.deployment.kind for h in selected}
    if "multinode" not in kinds:
        return None
    if len(kinds) > 1:
        raise InputError("the selected hosts mix fleet and multinode deployments; --limit one group")
    gpus = prof.server.tp_size * prof.server.dp_size
    if len(selected) < 2 or gpus % len(selected):
        raise InputError(
            f"a multinode server needs 2 or more hosts that split TP x DP = {gpus} GPUs evenly; "
            f"{len(selected)} selected: {', '.join(h.name for h in selected)}"
        )
    return selected


def rank_plans(prof: profile_mod.Profile, ranks: list[Any]) -> dict[str, Plan]:
    """Per-rank plans: --nnodes from the group size, --node-rank from the order, rank 0's address."""
    addr = f"{ranks[0].address}:{prof.deployment.dist_init_port}"
    nodes = (plan_mod.Node(rank, len(ranks), addr) for rank in range(len(ranks)))
    return {h.name: plan_mod.build(prof, node) for h, node in zip(ranks, nodes, strict=True)}


def _multinode_plans(
    prof: profile_mod.Profile, ranks: list[Any], by_rank: dict[str, Plan], secret: str
) -> dict[str, dict[str, Any]]:
    """Each rank's plan as the playbook's vars: every rank waits on rank 0's /health, the only
    HTTP endpoint, and checks its own share of the GPUs."""
    per_node = prof.server.tp_size * prof.server.dp_size // len(ranks)
    plans = {}
    for rank, host in enumerate(ranks):
        plan = by_rank[host.name]
        vars_ = profile_plan_vars(prof, plan, secret)
        vars_["gpus"] = list(range(per_node))
        vars_["health_url"] = health_url(plan, ranks[0].address)
        vars_["preflight"] = {**preflight_vars(prof, plan), "gpus_needed": per_node}
        vars_["rank"] = rank
        plans[host.name] = vars_
    return plans


def deploy(
    profile_ref: str,
    inventory: Path,
    options: Options = Options(),
    on_event: Callable[[TaskEvent], None] | None = None,
) -> DeployReport:
    """Validate, plan, run playbooks/deploy.yml, record the outcome, roll back failed hosts."""
    prof = profile_mod.load(profile_ref)
    plan = plan_mod.build(prof)
    secret = _secret_config(prof)
    run_id = uuid.uuid4().hex[:12]
    svc = prof.service
    ttl = svc.stop_timeout_s + 60 + svc.health_timeout_s + 120
    ranks = multinode_hosts(prof, inventory, options.limit)
    if ranks and (options.serial or options.max_fail_percent is not None):
        raise InputError(
            "--serial and --max-fail-percent roll through a fleet of replicas; a multi-node server "
            f"({', '.join(h.name for h in ranks)}) restarts all its ranks together: drop them"
        )
    default = {**profile_plan_vars(prof, plan, secret), "preflight": preflight_vars(prof, plan)}
    by_rank = rank_plans(prof, ranks) if ranks else {}
    plans = _multinode_plans(prof, ranks, by_rank, secret) if ranks else {}
    if not options.preflight:
        for vars_ in (default, *plans.values()):
            vars_.pop("preflight", None)
    digest_of = lambda host: by_rank.get(host, plan).digest  # noqa: E731
    extra = {
        "orch_plan": default,
        "orch_plans": plans,
        "orch_run_id": run_id,
        "orch_lock": _lock(run_id, ttl, options.lock_wait_s),
        "orch_force_restart": options.force_restart,
        "orch_kill_gpu_holders": options.kill_gpu_holders,
        "orch_preflight_done": sorted(h for h, d in _PREFLIGHT_PASSED if d == digest_of(h)),
    }
    if ranks:
        extra["orch_max_fail_percent"] = 0  # one rank failing ends every rank's play: the server is one
    if options.serial and not ranks:
        extra["orch_serial"] = options.serial
    if options.max_fail_percent is not None and not ranks:
        extra["orch_max_fail_percent"] = options.max_fail_percent
        extra.setdefault("orch_serial", 1)  # a limit on failures means nothing if all hosts start at once
    interrupted = False
    try:
        play = run_playbook(
            "deploy.yml",
            inventory,
            extra,
            limit=options.limit,
            check=options.check,
            env={"ORCH_SECRET_CONFIG": secret},
            on_event=on_event,
        )
    except PlayCanceled as exc:
        if exc.partial is None or options.check:
            raise
        play, interrupted = exc.partial, True
    if not play.hosts and not interrupted:
        raise inventory_mod.no_match(inventory, options.limit)
    reports = [_host_report(run, digest_of(run.host), options.check) for run in play.hosts.values()]
    if interrupted:
        _mark_interrupted(reports, play, on_event)
    for run in play.hosts.values():
        if any(e.role == "sglang_preflight" and e.kind == "ok" for e in run.events):
            _PREFLIGHT_PASSED.add((run.host, digest_of(run.host)))
    if "orch_serial" in extra or interrupted:  # only these leave hosts unstarted
        reports += _not_started(inventory, options.limit, play.hosts, interrupted)
    reports.sort(key=_host)
    if ranks:
        _group_diagnosis(reports, plans)
    report = DeployReport(prof.name, plan.digest, options.check, reports, str(play.artifacts), run_id)
    report.interrupted = interrupted
    if options.check:
        return report
    for r in reports:
        _record(run_id, r, by_rank.get(r.host, plan), "deploy")
    if not options.rollback:
        return report
    broken = [r for r in reports if not r.ok and (r.stopped or (interrupted and r.locked))]
    try:
        # After a Ctrl-C even the plan's own digest may be what a host needs back (--force-restart).
        failed = "" if interrupted else plan.digest
        rollback_hosts(inventory, broken, plan.unit_name, svc.health_timeout_s, run_id, failed, on_event)
    except PlayCanceled:
        report.interrupted = True
        for r in broken:
            if not r.rolled_back_to:
                r.rollback_error = "rollback interrupted (second Ctrl-C): see `status`; deploy or rollback"
    return report


def _mark_interrupted(
    reports: list[HostReport], play: PlayResult, on_event: Callable[[TaskEvent], None] | None
) -> None:
    """Ctrl-C stopped the play: each host it had not finished fails, named with the step it was in."""
    for r in reports:
        if r.ok or r.diagnosis:
            continue
        events = reversed(play.hosts[r.host].events)
        started = next((e for e in events if e.kind == "start" and e.role in STEPS), None)
        r.step = STEPS[started.role] if started else r.step
        r.diagnosis = f"interrupted (Ctrl-C) during {r.step}"
        if on_event and (r.stopped or r.locked):
            on_event(TaskEvent(r.host, "interrupted", "", "rolling back"))


def _group_diagnosis(reports: list[HostReport], plans: dict[str, dict[str, Any]]) -> None:
    """A multi-node server fails as one: every rank's report names the rank that died first."""
    failed = [r for r in reports if not r.ok and r.host in plans]
    if not failed:
        return
    dead = [r for r in failed if r.exited_at]
    first = min(dead, key=lambda r: r.exited_at) if dead else failed[0]
    rank = plans[first.host]["rank"]
    why = first.diagnosis or f"failed at {first.step}"
    for r in reports:
        if r.host in plans:
            r.ok = False
            r.diagnosis = f"group failed: node rank {rank} ({first.host}) failed first: {why}"


def _host(r: HostReport) -> str:
    return r.host


def _not_started(
    inventory: Path, limit: str | None, seen: dict[str, HostRun], interrupted: bool = False
) -> list[HostReport]:
    """Hosts the play never reached: an earlier batch failed past --max-fail-percent, or Ctrl-C."""
    missing = [h for h in inventory_mod.host_names(inventory, limit) if h not in seen]
    why = (
        "not started: interrupted (Ctrl-C) before this host; it was not touched"
        if interrupted
        else "not started: an earlier batch failed past --max-fail-percent; this host was not touched"
    )
    return [HostReport(h, False, False, False, None, "", "", "not started", diagnosis=why) for h in missing]


def _record(run_id: str, r: HostReport, plan: Plan, action: str) -> None:
    result = ("healthy" if r.restarted else "unchanged") if r.ok else "failed"
    row = ledger.DeployRow(
        run_id,
        r.host,
        plan.unit_name,
        plan.profile,
        plan.digest,
        action,
        result,
        r.restarted,
        r.elapsed_s,
        r.diagnosis,
    )
    ledger.record_deploy(row, good_unit=plan.unit if r.ok else None)


def rollback_hosts(
    inventory: Path,
    reports: list[HostReport],
    unit_name: str,
    health_timeout_s: int,
    run_id: str,
    failed_digest: str = "",
    on_event: Callable[[TaskEvent], None] | None = None,
    prefer_record: bool = False,
) -> dict[str, HostReport]:
    """Restore each host's last known good unit (the host's own record, else the ledger's), start it,
    wait for health; fills in `rolled_back_to` or `rollback_error` on each report, and returns the
    rollback's own report per host it ran on."""
    plans: dict[str, dict[str, Any]] = {}
    runs: dict[str, HostReport] = {}
    for r in reports:
        good = r.last_good if prefer_record else _good_unit(r, unit_name)
        if not good:
            r.rollback_error = "no last known good recorded for this host"
        elif good["digest"] == failed_digest:
            r.rollback_error = f"the last known good is the unit that just failed ({failed_digest})"
        else:
            plans[r.host] = unit_plan_vars(unit_name, good["profile"], good["unit"], health_timeout_s)
    if not plans:
        return runs
    extra = {
        "orch_plan": next(iter(plans.values())),
        "orch_plans": plans,
        "orch_run_id": run_id,
        "orch_lock": _lock(run_id, health_timeout_s + 300, LOCK_WAIT_S),
    }
    play = run_playbook("deploy.yml", inventory, extra, limit=",".join(plans), on_event=on_event)
    for r in reports:
        if r.host not in plans:
            continue
        vars_ = plans[r.host]
        run = play.hosts.get(r.host)
        done = _host_report(run, vars_["digest"], False) if run else None
        if done:
            runs[r.host] = done
        recorded = Plan(vars_["profile"], "", unit_name, [], {}, vars_["unit"], 0)
        if done and done.ok:
            r.rolled_back_to = f"{vars_['profile']} ({vars_['digest']})"
            _record(run_id, done, recorded, "rollback")
        else:
            r.rollback_error = done.diagnosis if done else "host not reached"
            if done:
                _record(run_id, done, recorded, "rollback")
    return runs


def _good_unit(r: HostReport, unit_name: str) -> dict[str, Any] | None:
    """After a failed deploy: the host's own last-good record, else the ledger's."""
    if r.last_good.get("unit"):
        return r.last_good
    row = ledger.good_unit(r.host, unit_name)
    return dict(row) if row else None


def rollback(
    inventory: Path,
    unit_name: str = "sglang.service",
    limit: str | None = None,
    to_profile: str | None = None,
    on_event: Callable[[TaskEvent], None] | None = None,
) -> DeployReport:
    """On demand: each host back to its previous healthy unit (or PROFILE's last healthy one)."""
    run_id = uuid.uuid4().hex[:12]
    reports = []
    for row in status(inventory, unit_name=unit_name, limit=limit):
        r = HostReport(row.host, False, False, False, None, row.digest, row.digest, "rollback")
        if not row.reachable:
            r.rollback_error = row.message or "unreachable"
        else:
            good = ledger.good_unit(row.host, unit_name, to_profile) if to_profile else None
            good = good or (None if to_profile else ledger.previous_good(row.host, unit_name, row.digest))
            if good is None:
                r.rollback_error = f"no healthy {to_profile or 'earlier'} unit recorded for this host"
            else:
                r.last_good = dict(good)
        reports.append(r)
    todo = [r for r in reports if r.last_good]
    runs = rollback_hosts(inventory, todo, unit_name, 1800, run_id, "", on_event, prefer_record=True)
    for r in reports:
        r.ok = bool(r.rolled_back_to)
        done = runs.get(r.host)
        if done:  # this report is the rollback itself: show what it did to the host
            r.changed, r.restarted, r.digest = done.changed, done.restarted, done.digest
            r.healthy_after_s, r.elapsed_s, r.journal = done.healthy_after_s, done.elapsed_s, done.journal
    return DeployReport(
        f"rollback{f' to {to_profile}' if to_profile else ''}", "", False, reports, "", run_id
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
    #: Whether the installed unit runs speculative decoding.
    speculative: bool = False
    #: Mean `accept len` of the newest decode log lines of this start of the unit (None: none yet).
    accept_len: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def status(
    inventory: Path, *, unit_name: str = "sglang.service", limit: str | None = None
) -> list[HostStatus]:
    """What each host runs now: profile, digest, unit state, MainPID, uptime, health, GPU memory,
    and the accept length its server logs."""
    from orchestrator.bench import accept_from_log  # bench imports this module

    play = run_playbook("status.yml", inventory, {"orch_unit_name": unit_name}, limit=limit)
    rows = []
    for run in play.hosts.values():
        accept_lines = ((run.result_of("", "Read the accept") or {}).get("stdout") or "").splitlines()
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
                speculative="--speculative-algorithm" in probe.get("unit", ""),
                accept_len=accept_from_log(accept_lines) if state.get("ActiveState") == "active" else None,
            )
        )
    return sorted(rows, key=lambda r: r.host)


def stop(inventory: Path, *, unit_name: str = "sglang.service", limit: str | None = None) -> list[HostReport]:
    """Stop the unit and confirm the GPUs are released, per host."""
    play = run_playbook("stop.yml", inventory, {"orch_unit_name": unit_name}, limit=limit)
    reports = []
    for run in play.hosts.values():
        failed = run.failed
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
                step=_step(run),
                message=failed.result.get("msg", "") if failed else "",
                gpus={"idle": gpus.get("idle"), "busy": gpus.get("busy", [])} if gpus else {},
                elapsed_s=round((run.finished or time.monotonic()) - run.started, 1),
            )
        )
    return sorted(reports, key=lambda r: r.host)


@dataclass
class PreflightResult:
    host: str
    ok: bool
    problems: list[str]
    sglang_version: str = ""
    gpus: int = 0
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def preflight(profile_ref: str, inventory: Path, limit: str | None = None) -> list[PreflightResult]:
    """Every read-only check a deploy of this profile makes before stopping anything, on every host."""
    prof = profile_mod.load(profile_ref)
    plan = plan_mod.build(prof)
    extra: dict[str, Any] = {"orch_preflight": preflight_vars(prof, plan), "orch_preflights": {}}
    ranks = multinode_hosts(prof, inventory, limit)
    if ranks:  # each rank is checked for its own flags and its share of the GPUs, as deploy does
        plans = _multinode_plans(prof, ranks, rank_plans(prof, ranks), "")
        extra["orch_preflights"] = {host: vars_["preflight"] for host, vars_ in plans.items()}
    play = run_playbook("preflight.yml", inventory, extra, limit=limit)
    results = []
    for run in play.hosts.values():
        res = run.result_of("sglang_preflight", "Check") or {}
        failed = run.failed
        problems = res.get("problems") or ([failed.result.get("msg", "failed")] if failed else [])
        results.append(
            PreflightResult(
                run.host,
                not problems,
                problems,
                res.get("sglang_version", ""),
                res.get("gpus", 0),
                round((run.finished or time.monotonic()) - run.started, 2),
            )
        )
    return sorted(results, key=lambda r: r.host)
