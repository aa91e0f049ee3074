"""deploy: a Plan carried out on hosts by playbooks/deploy.yml, each host's facts read back.

Engine layer: never prints. `deploy()` returns a `DeployReport`, and the CLI shows it. The vars that
go out are playvars.py's. The facts that come in are readback.py's. Reports are host_report.py's,
and rollback is rollback.py's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import ledger
from orchestrator.errors import InputError
from orchestrator.hosts import host_report as host_report_mod
from orchestrator.hosts import inventory as inventory_mod
from orchestrator.hosts import playvars, preflight_play, readback, rotation, startup_watch
from orchestrator.hosts.host_report import DeployReport, HostReport, host_report
from orchestrator.hosts.playvars import GatewayPlan, HostPlan, Placement, PlayVars, placements
from orchestrator.hosts.rollback import record, rollback_hosts
from orchestrator.hosts.runner import PlayCanceled, PlayResult, TaskEvent, run_playbook
from orchestrator.hosts.secrets import api_key, bundle, secret_bundle, secret_env_names
from orchestrator.profile.model import Profile
from orchestrator.render import systemd_check
from orchestrator.render.launch import Plan

#: How long a second deploy waits for a host's lock before failing, naming the holder.
LOCK_WAIT_S = 120
#: The least a hand command started again after a failed take-over may take to answer /health.
RELAUNCH_S = 600


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
    #: Read the model's files into the page cache before the stop, where the host has the memory.
    read_ahead: bool = True
    #: The hosts' model files were compared already (a canary's rollout): no comparison play.
    files_checked: bool = False
    #: Behind a gateway (orchestrator_gateway_url): take each batch out of its rotation and wait
    #: for the requests in flight before the stop, put it back once it generates.
    drain: bool = True
    drain_timeout_s: float = 60.0
    #: Put a drained host back in the gateway's rotation once it generates (a canary stays out
    #: while it is benched: canary.py puts it back).
    rejoin: bool = True
    #: Ansible's forks (hosts worked on at once); None: ansible.cfg's, else runner.DEFAULT_FORKS.
    forks: int | None = None
    #: Take the host lock under this id instead of the run's: a campaign's deploys share one, so
    #: each takes over the campaign's own lock.
    lock_id: str | None = None
    #: Leave the lock held when the run ends, ok or failed: a campaign holds its hosts between
    #: trials; its last deploy (same lock_id, keep_lock False) releases it.
    keep_lock: bool = False
    #: What the lock record says holds the host, shown to a deploy that has to wait ("tune
    #: campaign ID"); None: the profile's name.
    lock_profile: str | None = None
    #: Hold the lock at least this long before it counts as left by a dead run: a campaign
    #: benches between its deploys, longer than one deploy's own bound.
    lock_ttl_s: float = 0.0
    #: The lock names no process of this machine (`orchestrator plan`: the play runs later, from
    #: another process), so it is never taken for a dead deploy's; it expires after its TTL.
    lock_detached: bool = False


#: (host, plan digest) pairs that passed preflight in this process, with the model files their
#: preflight read (host_report.model_digest): a sweep's repeats skip them.
_PREFLIGHT_PASSED: dict[tuple[str, str], str] = {}


def gateways(where: dict[str, Placement], options: Options) -> dict[str, GatewayPlan]:
    """The hosts this deploy drains through their gateway, with the run's drain timeout."""
    if not options.drain:
        return {}
    timeout = {"drain_timeout_s": options.drain_timeout_s, "rejoin": options.rejoin}
    return {h: p.gateway.model_copy(update=timeout) for h, p in where.items() if p.gateway is not None}


def play_vars(
    prof: Profile,
    where: dict[str, Placement],
    options: Options,
    run_id: str,
    each: Mapping[str, Profile] | None = None,
) -> PlayVars:
    """The deploy's one extra var: a HostPlan per host (from `each[host]` where given, else
    `prof`), and how batches roll."""
    mine = each or {}
    ttl = max(options.lock_ttl_s, *(_lock_ttl_s(p) for p in (list(mine.values()) or [prof])))
    lock = None
    if not options.check:
        lock = playvars.lock(
            options.lock_id or run_id,
            options.lock_profile or prof.name,
            ttl,
            options.lock_wait_s,
            keep=options.keep_lock,
            detached=options.lock_detached,
        )
    drained = gateways(where, options)
    hosts = {
        name: preflight_play.calibrated(
            playvars.for_profile(
                mine.get(name, prof),
                p.plan,
                p.facts,
                preflight=options.preflight and (name, p.plan.digest) not in _PREFLIGHT_PASSED,
                lock=lock,
                force_restart=options.force_restart,
                kill_gpu_holders=options.kill_gpu_holders,
                gateway=drained.get(name),
                read_ahead=playvars.read_ahead(mine.get(name, prof)) if options.read_ahead else {},
                **_startup_plan(mine.get(name, prof), name, p.facts.model, options.check),
            ),
            name,
        )
        for name, p in where.items()
    }
    if each is None and not any(p.facts.nnodes > 1 for p in where.values()):
        hosts = {name: taking_over(name, hp, where[name].plan) for name, hp in hosts.items()}
    multinode = any(p.facts.nnodes > 1 for p in where.values())
    if multinode:  # one rank failing ends every rank's play: the server is one
        return PlayVars(hosts=hosts, max_fail_percent=0)
    if options.max_fail_percent is not None:  # a limit on failures means nothing if all start at once
        return PlayVars(hosts=hosts, serial=options.serial or 1, max_fail_percent=options.max_fail_percent)
    return PlayVars(hosts=hosts, serial=options.serial or 0)


def taking_over(host: str, hp: HostPlan, plan: Plan) -> HostPlan:
    """`hp`, with the hand-started server `adopt` recorded for its unit on `host` to stop first
    (ledger.pending_adoption); unchanged when there is none, or when `hp` is another profile than
    the one adopt wrote, or that profile no longer renders the command adopt proved equal to the
    live one (an edit of its flags or variables): then preflight names the port's holder."""
    from orchestrator.hosts import adopt_play

    row = ledger.pending_adoption(host, hp.unit_name)
    if row is None or row["profile"] != hp.profile:
        return hp
    proved = _command(row).get("digest")
    if proved and proved != adopt_play.command_digest(plan):
        return hp
    takeover = playvars.Takeover(pid=row["pid"], start_ticks=row["start_ticks"])
    update = {"takeover_pid": takeover.pid, "takeover_start_ticks": takeover.start_ticks}
    checks = hp.preflight.model_copy(update=update) if hp.preflight else None
    return hp.model_copy(update={"takeover": takeover, "preflight": checks})


def _command(row: Any) -> dict[str, Any]:
    """An adoption row's command JSON ({} where it does not read)."""
    try:
        data = json.loads(row["command"])
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_takeover_secrets(prof: Profile, hosts: Mapping[str, HostPlan]) -> None:
    """Before anything stops: each secret the profile gives a host it takes over must hold the value
    the hand-started server runs with (the sha256 adopt recorded); else an InputError naming it."""
    from orchestrator.hosts import adopt_play

    wrong = []
    for host, hp in hosts.items():
        row = ledger.pending_adoption(host, hp.unit_name) if hp.takeover is not None else None
        held = _command(row).get("secrets") if row is not None else None
        if isinstance(held, dict):
            wrong += [f"{host}: {line}" for line in adopt_play.secret_mismatches(prof, held)]
    if wrong:
        raise InputError("; ".join([*wrong, "nothing was stopped"]))


def _startup_plan(prof: Profile, host: str, model: str, check: bool) -> dict[str, Any]:
    """The health wait's start-up settings for `host`: stall limits and usual phase lengths from the
    ledger's history of `model` there, and the live reports."""
    if check:
        return {}
    usual = startup_watch.usual(host, model)
    svc = prof.service
    return {
        "stall_s": startup_watch.limits(usual, svc.stall_factor, svc.stall_floor_s),
        "usual_s": {k: round(v, 2) for k, v in usual.items()},
        "health_report_s": startup_watch.HEALTH_REPORT_S,
    }


def _lock_ttl_s(prof: Profile) -> float:
    """How long a deploy of `prof` may hold a host before its lock counts as left by a dead one:
    a read-ahead of the model's files may come first, under the lock."""
    svc = prof.service
    return playvars.READ_AHEAD_TIMEOUT_S + svc.stop_timeout_s + 60 + svc.health_timeout_s + 120


def deploy(
    prof: Profile,
    inventory: Path,
    options: Options = Options(),
    on_event: Callable[[TaskEvent], None] | None = None,
    *,
    each: Mapping[str, Profile] | None = None,
) -> DeployReport:
    """Plan, run playbooks/deploy.yml, record the outcome, roll back failed hosts.

    `each` (host -> profile) gives every host its own profile in the one play (a tune
    campaign's trials, one per host): its keys are the hosts, and `prof` names the run and gives
    what they share (secrets, the lock's profile text)."""
    run_id = uuid.uuid4().hex[:12]
    if not options.check:  # a server is never stopped by a deploy that could not record it
        ledger.ready()
    where, orch = planned(prof, inventory, options, run_id, each)
    check_takeover_secrets(prof, orch.hosts)
    compare = len(where) > 1 and each is None and options.preflight and not options.files_checked
    if compare and (options.force_restart or not _all_running(where)):
        same_files(prof, inventory, where)
        orch = play_vars(prof, where, options, run_id, each)  # the hosts that passed skip theirs
    limit = options.limit if each is None else ",".join(each)
    multinode = len(where) > 1 and any(p.facts.nnodes > 1 for p in where.values())
    drained, keys, serial = gateway_checks(where, orch, inventory, options)
    if serial != options.serial and not multinode:
        orch = orch.model_copy(update={"serial": serial})
    interrupted = False
    try:
        play = run_playbook(
            "deploy.yml",
            inventory,
            orch,
            limit=limit,
            check=options.check,
            forks=options.forks,
            secret=secret_bundle(prof),
            hide_env=secret_env_names(prof),
            on_event=on_event,
        )
    except PlayCanceled as exc:
        if exc.partial is None or options.check:
            raise
        play, interrupted = exc.partial, True
    reports = _reports(play, where, options.check)
    if interrupted:
        _mark_interrupted(reports, play, on_event)
    if orch.serial or interrupted:  # only these leave hosts unstarted
        reports += _not_started(where, play, interrupted)
    reports.sort(key=lambda r: r.host)
    for r in reports:
        if r.host in drained:
            r.gateway = {"url": drained[r.host].url, "worker_url": drained[r.host].worker_url, **r.gateway}
    if multinode:
        _group_diagnosis(reports, where)
    plan = next(iter(where.values())).plan
    digest = "" if multinode or each is not None else plan.digest  # each rank or trial: its own unit
    report = DeployReport(prof.name, digest, options.check, reports, str(play.artifacts), run_id)
    report.interrupted = interrupted
    if options.check:
        return report
    for r in reports:
        if r.host in where:
            if r.restarted:  # what its logged memory depends on, for the next fit's calibration
                r.memory["settings"] = playvars.memory_settings((each or {}).get(r.host, prof))
            record(run_id, r, orch.hosts[r.host], "deploy")
    if options.rollback:
        _roll_back(report, inventory, orch.hosts, plan.unit_name, on_event, api_key(prof) or "", options)
    taken = {h: hp for h, hp in orch.hosts.items() if hp.takeover is not None}
    if taken:
        _after_takeover(report, inventory, taken, on_event, relaunch=options.rollback)
    if drained:  # a worker this run took out goes back, or the report says why it stays out
        owed = reports if options.rejoin else [r for r in reports if not r.ok]
        rotation.restore(owed, drained, keys, api_key(prof) or "")
        if options.rejoin:  # a healthy server the gateway lists failed goes back in too
            rotation.heal(reports, drained, keys, api_key(prof) or "")
    return report


def gateway_checks(
    where: dict[str, Placement], orch: PlayVars, inventory: Path, options: Options
) -> tuple[dict[str, GatewayPlan], dict[str, str], str | None]:
    """Before anything is stopped: each gateway answers and lists its hosts (a canary's caller took
    them out of rotation itself, having checked them: canary.py), and a PD role's batches keep it
    serving. The hosts drained, their gateways' keys, and the --serial the play rolls with."""
    drained = {h: p.gateway for h, p in orch.hosts.items() if p.gateway is not None}
    keys = rotation.api_keys(inventory, drained)
    serial = options.serial
    if drained and options.rejoin:
        rotation.check(drained, keys)
        # A PD role rolls one server at a time while it serves, never emptying a role's rotation.
        changing = [h for h in where if options.force_restart or not _all_running({h: where[h]})]
        serial = rotation.pd_serial(list(where), drained, keys, options.serial, changing)
    return drained, keys, serial


def ready_to_roll(prof: Profile, inventory: Path, options: Options) -> None:
    """What deploy() checks before its play, without the play: the hosts' placement, systemd's
    reading of each unit, and the gateway. A PD fleet checks its second role before the first rolls."""
    where, orch = planned(prof, inventory, options, "ready-to-roll")
    gateway_checks(where, orch, inventory, options)


def _all_running(where: dict[str, Placement]) -> bool:
    """Whether every host's last healthy deploy, in the ledger, is this very plan: the deploy then
    restarts none that is still healthy, and the files were compared when it was made."""
    for host, p in where.items():
        good = ledger.good_unit(host, p.plan.unit_name)
        if good is None or good["digest"] != p.plan.digest:
            return False
    return True


def same_files(prof: Profile, inventory: Path, where: dict[str, Placement]) -> None:
    """Before a deploy to several hosts stops anything: every host's preflight at once, and the
    same model and drafter files on each (preflight_play.FilesDiffer names a host whose files
    differ). A host that passed is not checked again in the deploy's own play."""
    for r in preflight_play.require_same_files(prof, inventory, where):
        if r.ok:
            digest = host_report_mod.model_digest(r.model_files)
            _PREFLIGHT_PASSED[(r.host, where[r.host].plan.digest)] = digest


def planned(
    prof: Profile,
    inventory: Path,
    options: Options,
    run_id: str,
    each: Mapping[str, Profile] | None = None,
) -> tuple[dict[str, Placement], PlayVars]:
    """Each host's placement and the play's one extra var, checked before any host is touched: the
    inventory matches, a multi-node server is not rolled in batches, and systemd reads every unit.
    What deploy runs, and what `orchestrator plan` prints for a team's own ansible-playbook."""
    where = (
        placements(prof, inventory, options.limit)
        if each is None
        else _each_placements(prof, each, inventory, options)
    )
    multinode = len(where) > 1 and any(p.facts.nnodes > 1 for p in where.values())
    if multinode and (options.serial or options.max_fail_percent is not None):
        raise InputError(
            "--serial and --max-fail-percent roll through a fleet of replicas; a multi-node server "
            f"({', '.join(where)}) restarts all its ranks together: drop them"
        )
    if not where:
        raise inventory_mod.no_match(inventory, options.limit)
    _refuse_pattern_names(list(where))
    # systemd's reading, before any host
    for p, hosts in _by_profile(prof, each, list(where)):
        systemd_check.require(p, [where[h].plan for h in hosts])
    return where, play_vars(prof, where, options, run_id, each)


def _refuse_pattern_names(hosts: list[str]) -> None:
    """The play names its hosts (deploy.yml's `hosts:` is orch.hosts), and Ansible reads each name as
    a host pattern: a name it would split (at a `:` that is no address's), negate (`!`), intersect
    (`&`), match as a regex (`~`) or subscript (`[...]`) would not be that host, and the host would
    silently be left out of the play."""
    from ansible.inventory.manager import split_host_pattern

    bad = [
        h
        for h in hosts
        if split_host_pattern(h) != [h] or h[:1] in "!&~" or ("[" in h and not h.startswith("["))
    ]
    if bad:
        raise InputError(
            f"inventory host name {bad[0]!r} reads as an Ansible host pattern, not as that host, in the "
            "play's host list: rename the host in the inventory (its ansible_host can keep the address)"
        )


def _each_placements(
    prof: Profile, each: Mapping[str, Profile], inventory: Path, options: Options
) -> dict[str, Placement]:
    """Each host's placement for its own profile (deploy(each=...)), refusing what one play of
    several trials cannot carry: a host the inventory lacks, a multi-node server, other secrets."""
    if options.limit is not None:
        raise InputError(
            f"each names the hosts (--limit {options.limit} was given too): leave the limit unset"
        )
    if not each:
        raise InputError("each names no host: map each host to its trial's profile")
    found = {h.name: h for h in inventory_mod.hosts(inventory, ",".join(each))}
    missing = [h for h in each if h not in found]
    if missing:
        raise InputError(
            f"each: {', '.join(missing)}: not a host of {inventory} (give host names, not groups or patterns)"
        )
    shared = _shared(prof)
    for host, p in each.items():
        _refuse_trial(prof, p, found[host], shared)
    return {host: placements(p, inventory, host)[host] for host, p in each.items()}


#: What the trials of one play must share, in _shared's order: the play carries one set of secrets.
_SHARED = ("api_key", "source variables (api_key.env, secret_env)", "secret_env or service.environment_files")


def _shared(prof: Profile) -> tuple[str, list[str], str]:
    return api_key(prof), secret_env_names(prof), secret_bundle(prof)


def _refuse_trial(
    prof: Profile, p: Profile, host: inventory_mod.InventoryHost, shared: tuple[str, list[str], str]
) -> None:
    """InputError when `p` cannot be one trial of `prof`'s play on `host`."""
    if playvars.deployment_kind(p, host) == "multinode":
        said = "the host's orchestrator_deployment" if host.deployment else "deployment.kind"
        raise InputError(
            f"each: {host.name}: {p.name} would be a multi-node server ({said} is multinode), and a "
            "multi-node server cannot be one of several trials: give the host a single-node profile"
        )
    differs = next((w for w, a, b in zip(_SHARED, _shared(p), shared, strict=True) if a != b), "")
    if differs:
        raise InputError(
            f"each: {host.name}: {p.name}'s {differs} differ from {prof.name}'s: trials may not vary "
            "secrets; give every trial the same ones"
        )
    if p.service.unit_name != prof.service.unit_name:
        raise InputError(
            f"each: {host.name}: {p.name}'s service.unit_name {p.service.unit_name} is not {prof.name}'s "
            f"{prof.service.unit_name}: trials deploy one unit, under one lock; give them the same name"
        )


def _by_profile(
    prof: Profile, each: Mapping[str, Profile] | None, hosts: list[str]
) -> list[tuple[Profile, list[str]]]:
    """The distinct profiles of a deploy, each with its hosts (without `each`: `prof` on all)."""
    if each is None:
        return [(prof, hosts)]
    groups: dict[int, tuple[Profile, list[str]]] = {}
    for h in hosts:
        groups.setdefault(id(each[h]), (each[h], []))[1].append(h)
    return list(groups.values())


def _reports(play: PlayResult, where: dict[str, Placement], check: bool) -> list[HostReport]:
    reports = []
    for run in play.hosts.values():
        f = readback.of_run(run)
        plan = where[run.host].plan
        report = host_report(f, plan.digest, plan.unit, check)
        if f.probe.preflight and not f.problems:
            _PREFLIGHT_PASSED[(run.host, plan.digest)] = report.model_digest
        elif not report.model_digest:  # preflight skipped: the files an earlier one read
            report.model_digest = _PREFLIGHT_PASSED.get((run.host, plan.digest), "")
        reports.append(report)
    return reports


def _roll_back(
    report: DeployReport,
    inventory: Path,
    plans: dict[str, HostPlan],
    unit_name: str,
    on_event: Callable[[TaskEvent], None] | None,
    server_key: str = "",
    options: Options = Options(),
) -> None:
    """Put every host this deploy broke back on its last good unit (and a drained one back in its
    gateway's rotation once healthy: the rollback's play does it, and the report says so), under
    the deploy's own lock id, kept as the deploy keeps it."""
    # A hand-started server this run took over comes back as it was (_after_takeover), not as a
    # unit; unless its step said there was none to take (the process had ended).
    broken = [
        r
        for r in report.hosts
        if not r.ok and (r.stopped or (report.interrupted and r.locked)) and not _owes_hand(r, plans)
    ]
    timeout = max((p.health_timeout_s for p in plans.values()), default=1800)
    # After a Ctrl-C even the plan's own digest may be what a host needs back (--force-restart).
    failed = {} if report.interrupted else {name: p.digest for name, p in plans.items()}
    # A rolled-back server goes back into rotation once healthy, a canary's too.
    drained = {h: p.gateway.model_copy(update={"rejoin": True}) for h, p in plans.items() if p.gateway}
    secret = bundle(key=server_key) if drained else ""
    try:
        runs = rollback_hosts(
            inventory,
            broken,
            unit_name,
            timeout,
            report.run_id,
            failed,
            on_event,
            gateways=drained,
            secret=secret,
            lock_id=options.lock_id,
            keep_lock=options.keep_lock,
            lock_profile=options.lock_profile,
        )
        for r in broken:
            back = runs[r.host].gateway.get("back") if r.host in runs else None
            if back and not back.get("error"):
                r.gateway["back"] = back
    except PlayCanceled:
        report.interrupted = True
        for r in broken:
            if not r.rolled_back_to:
                r.rollback_error = "rollback interrupted (second Ctrl-C): see `status`; deploy or rollback"


def _owes_hand(r: HostReport, plans: dict[str, HostPlan]) -> bool:
    """Whether a failed host owes its hand-started server back rather than a unit: it planned a
    takeover, and the step took the server, or never said (a Ctrl-C, a lost connection)."""
    hp = plans.get(r.host)
    return hp is not None and hp.takeover is not None and r.takeover.get("taken") is not False


def _after_takeover(
    report: DeployReport,
    inventory: Path,
    taken: dict[str, HostPlan],
    on_event: Callable[[TaskEvent], None] | None,
    *,
    relaunch: bool,
) -> None:
    """After a deploy that took over hand-started servers: the ledger's adoption says what became
    of each; where the unit failed after the hand server was stopped, the hand command starts
    again as it ran (with `relaunch`, the deploy's rollback), and the report says so."""
    from orchestrator.hosts import adopt_play

    owed: dict[str, playvars.Relaunch] = {}
    rows: dict[str, Any] = {}
    for r in report.hosts:
        hp = taken.get(r.host)
        row = rows[r.host] = ledger.pending_adoption(r.host, hp.unit_name) if hp else None
        if hp is None or row is None:
            continue
        if r.ok:
            ledger.update_adoption(row["id"], "taken" if r.takeover.get("taken") else "gone")
        elif relaunch and (r.stopped or report.interrupted) and _owes_hand(r, taken):
            # The hand command had no limit of its own: the unit's, but never less than RELAUNCH_S.
            # The module starts nothing while the process taken over still runs.
            assert hp.takeover is not None
            owed[r.host] = playvars.Relaunch(
                unit_name=hp.unit_name,
                health_url=hp.facts.health_url,
                health_timeout_s=max(hp.health_timeout_s, RELAUNCH_S),
                gpus=hp.facts.gpus,
                pid=hp.takeover.pid,
                start_ticks=hp.takeover.start_ticks,
            )
    if not owed:
        return
    back = adopt_play.relaunch(inventory, owed, on_event)
    for r in report.hosts:
        if r.host not in back:
            continue
        r.relaunched = back[r.host]
        pid = back[r.host].get("pid")
        if back[r.host].get("healthy") and pid == owed[r.host].pid:
            r.rolled_back_to = f"the hand-started server, never stopped (PID {pid})"
            r.rollback_error = ""
        elif back[r.host].get("healthy"):
            row = rows[r.host]
            if row is not None:  # the next deploy takes over the process that runs now
                ledger.update_adoption(row["id"], "relaunched")
                again = {k: row[k] for k in ("host", "unit_name", "profile", "port", "command")}
                ticks = back[r.host].get("start_ticks")
                ledger.record_adoption({**again, "pid": pid, "start_ticks": ticks, "state": "pending"})
            r.rolled_back_to = f"the hand command, started again (PID {pid})"
            r.rollback_error = ""
        else:
            why = back[r.host].get("error") or "it did not answer health"
            r.rollback_error = f"the hand command did not start again: {why}"


def _mark_interrupted(
    reports: list[HostReport], play: PlayResult, on_event: Callable[[TaskEvent], None] | None
) -> None:
    """Ctrl-C stopped the play: each host it had not finished fails, named with the step it was in."""
    for r in reports:
        if r.ok or r.diagnosis:
            continue
        events = reversed(play.hosts[r.host].events)
        started = next((e for e in events if e.kind == "start" and readback.step_of(e)), None)
        r.step = readback.step_of(started) if started else r.step
        r.diagnosis = f"interrupted (Ctrl-C) during {r.step}"
        if on_event and (r.stopped or r.locked):
            on_event(TaskEvent(r.host, "interrupted", "", "", {"msg": "rolling back"}))


_PEER_GONE = re.compile(r"remote process exited|ncclRemoteError|Connection closed by remote peer", re.I)


def _group_diagnosis(reports: list[HostReport], where: dict[str, Placement]) -> None:
    """A multi-node server fails as one: every rank's report names the rank that died first."""
    failed = [r for r in reports if not r.ok and r.host in where]
    if not failed:
        return
    dead = [r for r in failed if r.exited_at]
    # A rank that saw its peer go (ncclRemoteError) died of another's death, even when its own
    # systemd recorded the exit a few milliseconds earlier (clock skew, a busy host's reaper).
    causes = [r for r in dead if not _PEER_GONE.search(r.diagnosis)] or dead
    # Otherwise the rank that failed a step itself: not one Ansible stopped because another failed
    # (any_errors_fatal: no failed task, no diagnosis), nor one refused at the ranks gate.
    own = [r for r in failed if r.diagnosis and r.step != readback.STEPS[readback.RANKS_GATE]]
    first = min(causes, key=lambda r: r.exited_at) if causes else (own or failed)[0]
    rank = where[first.host].facts.rank
    why = first.diagnosis or f"failed at {first.step}"
    for r in reports:
        if r.host in where:
            r.ok = False
            r.diagnosis = f"group failed: node rank {rank} ({first.host}) failed first: {why}"


def _not_started(where: dict[str, Placement], play: PlayResult, interrupted: bool) -> list[HostReport]:
    """Hosts the play never reached: an earlier batch failed past --max-fail-percent, or Ctrl-C."""
    why = (
        "not started: interrupted (Ctrl-C) before this host; it was not touched"
        if interrupted
        else "not started: an earlier batch failed past --max-fail-percent; this host was not touched"
    )
    missing = [h for h in where if h not in play.hosts]
    return [HostReport(host=h, ok=False, step="not started", diagnosis=why) for h in missing]
