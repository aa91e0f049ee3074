"""The commands that run plays on hosts: deploy, plan, preflight, rollback, history, status, stop, verify.

Each prints, and picks its exit code, here.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from orchestrator.cli import console, params
from orchestrator.cli.console import (
    err,
    handle_errors,
    inventory_or_lab,
    inventory_or_running_lab,
    out,
    plain,
    shown,
)
from orchestrator.errors import InputError
from orchestrator.profile import model as profile_mod

inventory_option = console.inventory_option("the local lab, brought up if needed")
limit_option = console.limit_option()
unit_option = console.unit_option


profile_option = click.option(
    "--profile", "-p", "profile_ref", metavar="NAME|PATH", required=True, help="Profile name or file."
)
#: What deploy and plan both take after the profile and the inventory: the hosts, and how the
#: deploy rolls over them.
ROLLOUT_OPTIONS = (
    limit_option,
    click.option(
        "--force-restart", is_flag=True, help="Restart even when the unit is unchanged and healthy."
    ),
    click.option(
        "--kill-gpu-holders",
        is_flag=True,
        help="Kill processes outside our unit that hold the GPUs (never by default).",
    ),
    click.option(
        "--lock-wait",
        type=params.Decimal(0, 86400),
        default=120,
        show_default=True,
        help="Seconds to wait for another deploy's lock on a host.",
    ),
    click.option(
        "--serial", metavar="N|P%", help="Deploy in batches of N hosts (or P% of them), each healthy first."
    ),
    click.option(
        "--max-fail-percent",
        type=params.Integer(0, 100),
        help="Start no further batch once more than this percent of a batch failed (implies --serial 1).",
    ),
    click.option(
        "--no-preflight",
        is_flag=True,
        help="Skip the read-only checks before a restart (to debug a failing start).",
    ),
    click.option(
        "--no-read-ahead",
        is_flag=True,
        help="Do not read the model's files into the page cache before the stop (it is done only "
        "where the host has the memory for all of them).",
    ),
    click.option(
        "--no-drain",
        is_flag=True,
        help="Behind a gateway (orchestrator_gateway_url): restart under traffic, without taking "
        "each batch out of its rotation first.",
    ),
    click.option(
        "--drain-timeout",
        type=params.Decimal(0, 86400),
        default=60,
        show_default=True,
        help="Seconds to wait for a drained server's requests in flight before it is stopped anyway.",
    ),
)


def rollout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(ROLLOUT_OPTIONS):
        command = option(command)
    return command


def _rollout(
    limit: str | None,
    force_restart: bool,
    kill_gpu_holders: bool,
    lock_wait: float,
    serial: str | None,
    max_fail_percent: int | None,
    no_preflight: bool,
    no_read_ahead: bool,
    no_drain: bool,
    drain_timeout: float,
) -> dict[str, Any]:
    """ROLLOUT_OPTIONS' values (but the profile and inventory) as deploy.Options fields."""
    return {
        "limit": limit,
        "force_restart": force_restart,
        "kill_gpu_holders": kill_gpu_holders,
        "lock_wait_s": lock_wait,
        "serial": _serial(serial),
        "max_fail_percent": max_fail_percent,
        "preflight": not no_preflight,
        "read_ahead": not no_read_ahead,
        "drain": not no_drain,
        "drain_timeout_s": drain_timeout,
    }


@click.command()
@click.option(
    "--profile",
    "-p",
    "profile_refs",
    metavar="NAME|PATH",
    required=True,
    multiple=True,
    help="Profile name or file. A prefill/decode fleet: its prefill and its decode profile, twice -p.",
)
@inventory_option
@rollout_options
@click.option(
    "--check", is_flag=True, help="Dry run: Ansible check mode with diff; changes nothing on any host."
)
@click.option(
    "--no-rollback",
    is_flag=True,
    help="Leave failed hosts as they failed (for debugging) instead of rolling back.",
)
@click.option(
    "--forks",
    type=params.Integer(1, 5000),
    help="Hosts Ansible works on at once (ansible-playbook --forks). Default: ansible.cfg's forks, else 20.",
)
@click.option(
    "--canary", is_flag=True, help="Deploy and bench the first host; the rest only if tok/s held up."
)
@click.option(
    "--canary-margin",
    type=params.Decimal(0, 1),
    default=0.05,
    show_default=True,
    help="Largest tok/s drop (fraction) the canary may show against the profile it replaced.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def deploy(
    profile_refs: tuple[str, ...],
    inventory: Path | None,
    check: bool,
    no_rollback: bool,
    forks: int | None,
    canary: bool,
    canary_margin: float,
    as_json: bool,
    **rollout: Any,
) -> None:
    """Stop, check GPUs idle, write the unit, start, wait for health: only where something changed.

    A host that fails after its server was stopped is rolled back to its last known good unit.
    Behind a gateway, each batch leaves its rotation and drains first, and goes back once it generates.
    A prefill/decode fleet (-p PREFILL -p DECODE) deploys its prefill role first (docs/pd.md).
    """
    from orchestrator.cli import view
    from orchestrator.hosts import deploy as deploy_mod
    from orchestrator.hosts import pd

    # fail on a bad profile, or two that make no fleet, before touching the lab
    profs = pd.ordered([profile_mod.load(ref) for ref in profile_refs])
    options = deploy_mod.Options(**_rollout(**rollout), check=check, rollback=not no_rollback, forks=forks)
    if canary and pd.role(profs[0]) is not None:
        raise InputError(
            "--canary benches one host alone, and a prefill or decode server serves only in a pair"
        )
    inv = inventory_or_lab(inventory)
    title = f"{'check' if check else 'deploy'} {'+'.join(p.name for p in profs)} -> {inv}"
    if canary and not check:
        prof = profs[0]
        view.show_deploy(
            lambda on_event: _canary(prof, inv, options, canary_margin, on_event), title, as_json
        )
        return
    view.show_deploy(lambda on_event: pd.deploy(profs, inv, options, on_event), title, as_json, check)


@click.command("plan")
@profile_option
@console.inventory_option("the local lab that is up (plan never brings one up)")
@rollout_options
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A profile with secrets (api_key, secret_env): write them to this new file (mode 0600), "
    "which the play reads on the control machine; remove it after the play.",
)
def plan_command(profile_ref: str, inventory: Path | None, secret_file: Path | None, **rollout: Any) -> None:
    """Print what `deploy` would hand its play, for a team's own ansible-playbook.

    The JSON is the extra vars of the collection orchestrator.sglang's deploy and preflight
    playbooks and of its roles (`orch`, a HostPlan per host): ansible-playbook -i INVENTORY
    -e @plan.json orchestrator.sglang.deploy. The play runs on the planned hosts only. A plan is for
    one run: its deploy lock is that run's (print a new plan for each run). Nothing on a host is
    touched here, and the play records nothing in orchestrator's ledger.
    """
    import uuid

    from orchestrator.hosts import deploy as deploy_mod
    from orchestrator.hosts.runner import write_private
    from orchestrator.hosts.secrets import secret_bundle

    prof = profile_mod.load(profile_ref)
    options = deploy_mod.Options(**_rollout(**rollout), lock_detached=True)
    secret = secret_bundle(prof)
    if secret and secret_file is None:
        raise InputError(
            f"profile {prof.name} has secrets (api_key or secret_env): plan writes them only to a file of "
            "their own, never into the plan: pass --secret-file PATH (a new file, mode 0600)"
        )
    if secret_file is not None and not secret:
        raise InputError(f"profile {prof.name} has no secrets: drop --secret-file")
    inv = inventory_or_running_lab(inventory)
    _where, orch = deploy_mod.planned(prof, inv, options, uuid.uuid4().hex[:12])
    if secret_file is not None:
        try:
            write_private(secret_file, secret)
        except FileExistsError:
            raise InputError(
                f"--secret-file {secret_file}: the file exists; remove it or name a new one"
            ) from None
        except OSError as exc:
            raise InputError(f"--secret-file {secret_file}: {exc.strerror or exc}") from None
        orch = orch.model_copy(update={"secret_file": str(secret_file.resolve())})
    click.echo(json.dumps(orch.extravars(), indent=2))


def _deployed_profile(ref: str, given: bool) -> profile_mod.Profile:
    """A profile verify checks against: given, or the one the hosts say they run."""
    if given:
        return profile_mod.load(ref)
    try:
        return profile_mod.load(ref)
    except InputError:
        raise InputError(
            f"the hosts run profile {ref!r}, which is not in {profile_mod.profiles_dir()[1]} "
            f"(deployed from a file, or as {profile_mod.EXAMPLE}NAME?); give it as --profile PATH "
            "or --profile example:NAME"
        ) from None


def _canary(prof: profile_mod.Profile, inv: Path, options: Any, margin: float, on_event: Any) -> Any:
    """The canary's verdict on stderr, then the usual report (failed when it was rejected)."""
    from orchestrator.tuning import bench as bench_mod
    from orchestrator.tuning.canary import canary_deploy

    settings = bench_mod.Settings(requests=4, max_tokens=128, warmup=1)
    verdict, report = canary_deploy(prof, inv, options, margin, settings, on_event)
    before = f"{verdict.before_tok_s:.1f}" if verdict.before_tok_s is not None else "-"
    after = f"{verdict.after_tok_s:.1f}" if verdict.after_tok_s is not None else "-"
    word = "accepted" if verdict.accepted else "REJECTED"
    err.print(f"canary {shown(verdict.host)}: {before} -> {after} tok/s: {word}: {shown(verdict.reason)}")
    if not verdict.accepted:
        for h in report.hosts:
            h.ok = False
            h.diagnosis = h.diagnosis or f"canary rejected: {verdict.reason}"
    return report


def _serial(value: str | None) -> str | None:
    if value is None:
        return None
    number = value.removesuffix("%")
    if (
        not (number.isascii() and number.isdigit())
        or int(number) < 1
        or (value.endswith("%") and int(number) > 100)
    ):
        raise InputError(f"--serial {value!r}: give a host count such as 2, or a percentage such as 25%")
    return value


@click.command()
@click.option(
    "--profile", "-p", "profile_ref", metavar="NAME|PATH", required=True, help="Profile name or file."
)
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def preflight(profile_ref: str, inventory: Path | None, limit: str | None, as_json: bool) -> None:
    """Read-only checks a deploy makes before stopping anything: SGLang version and flags, model and
    drafter, GPUs for TP x DP, the port, log space. One line per problem per host."""
    from orchestrator.cli import view
    from orchestrator.hosts import preflight_play

    prof = profile_mod.load(profile_ref)
    results = preflight_play.preflight(prof, inventory_or_lab(inventory), limit)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        for r in results:
            if r.ok:
                where = f" in image {prof.runtime.image}" if prof.runtime.container else ""
                summary = f"ok (SGLang {r.sglang_version}{where}, {r.gpus} GPUs, {r.elapsed_s:.1f} s)"
                out.print(f"{shown(r.host)}: {shown(summary)}", soft_wrap=True)
            for note in r.notes:
                out.print(f"{shown(r.host)}: note: {shown(note)}", style="yellow", soft_wrap=True)
            for problem in r.problems:
                out.print(f"{shown(r.host)}: {shown(problem)}", style="red", soft_wrap=True)
        table = view.memory_table(results)
        if table is not None:
            out.print(table)
    sys.exit(0 if results and all(r.ok for r in results) else 1)


@click.command()
@inventory_option
@limit_option
@unit_option
@click.option(
    "--to", "to_profile", metavar="PROFILE", help="Roll back to the last healthy unit of this profile."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def rollback(
    inventory: Path | None, limit: str | None, unit_name: str, to_profile: str | None, as_json: bool
) -> None:
    """Put each host back on its previous healthy unit (or PROFILE's), start it, wait for health."""
    from orchestrator.cli import view
    from orchestrator.hosts import rollback as rollback_mod

    inv = inventory_or_lab(inventory)
    title = f"rollback{f' to {to_profile}' if to_profile else ''} -> {inv}"
    view.show_deploy(
        lambda on_event: rollback_mod.rollback(inv, unit_name, limit, to_profile, on_event), title, as_json
    )


@click.command()
@click.option("--host", help="Only this host.")
@click.option(
    "--last",
    "-n",
    "count",
    type=params.Integer(1, 10000),
    default=30,
    show_default=True,
    help="The newest N rows.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def history(host: str | None, count: int, as_json: bool) -> None:
    """The deploys recorded in the ledger, newest first: host, profile, result, duration, and
    where each start went (its longest phases)."""
    from orchestrator import ledger
    from orchestrator.hosts import startup_watch
    from orchestrator.hosts.module_results import Phase

    rows = [dict(r) for r in ledger.history(host, count)]
    for r in rows:  # [{phase, s}], plain JSON: an entry a hand edit broke is left out, with a note
        r["phases"] = ledger.deploy_phases(r)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"history ({shown(ledger.shown())})", title_justify="left")
    # A team's ledger: which control machine ran each deploy, once there are two.
    machines = len({r["origin"] for r in rows if r.get("origin")}) > 1
    for col in (
        "time",
        "host",
        "action",
        "profile",
        "digest",
        "result",
        "restarted",
        "duration",
        "start-up",
        "diagnosis",
        *(["machine"] if machines else []),
    ):
        table.add_column(col, overflow="fold")
    for r in rows:  # each row's columns hold what the schema says: ledger.history skips others
        table.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])),
            *(shown(r[column]) for column in ("host", "action", "profile", "digest")),
            plain(r["result"], "red" if r["result"] == "failed" else ""),
            "yes" if r["restarted"] else "no",
            f"{r['duration_s']:.1f} s",
            plain(startup_watch.longest([Phase.model_validate(p) for p in r["phases"]])),
            shown(r["diagnosis"]),
            *([shown(r.get("origin") or "")] if machines else []),
        )
    out.print(table)


@click.command()
@inventory_option
@limit_option
@click.option(
    "--unit",
    "unit_name",
    default="",
    metavar="UNIT",
    help="Only this systemd unit.  [default: every unit orchestrator deployed on each host]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def status(inventory: Path | None, limit: str | None, unit_name: str, as_json: bool) -> None:
    """Per unit of each host: profile and digest, port, GPUs, state, MainPID, uptime, health, and the
    memory and holders of that unit's GPUs."""
    from orchestrator.cli import view
    from orchestrator.hosts import status_play

    rows = status_play.status(inventory_or_lab(inventory), unit_name=unit_name, limit=limit)
    # A host whose play failed (sudo refused, say) was not read: its row alone would look merely odd.
    unread = [r for r in rows if r.message or not r.reachable]
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
        sys.exit(1 if unread else 0)
    out.print(view.status_table(rows, unit_name))
    for r in unread:
        first = (r.message.strip() or "unreachable").splitlines()[0]
        err.print(f"{shown(r.host)}: {shown(first)}", style="red")
    sys.exit(1 if unread else 0)


@click.command()
@inventory_option
@limit_option
@unit_option
@handle_errors
def stop(inventory: Path | None, limit: str | None, unit_name: str) -> None:
    """Stop the server and confirm the GPUs are released."""
    from orchestrator.hosts import stop_play

    reports = stop_play.stop(inventory_or_running_lab(inventory), unit_name=unit_name, limit=limit)
    for r in reports:
        if r.ok:
            out.print(f"{shown(r.host)}: stopped, GPUs released ({r.elapsed_s:.1f} s)")
        else:
            err.print(f"{shown(r.host)}: failed at {shown(r.step)}: {shown(r.message)}", style="red")
    sys.exit(0 if all(r.ok for r in reports) else 1)


@click.command()
@click.option(
    "--profile",
    "-p",
    "profile_refs",
    metavar="NAME|PATH",
    multiple=True,
    help="Default: the profile the hosts run (a PD fleet: its two). A PD fleet: -p PREFILL -p DECODE.",
)
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@handle_errors
def verify(profile_refs: tuple[str, ...], inventory: Path | None, limit: str | None, as_json: bool) -> None:
    """Check hosts with testinfra: unit equals the plan, service active, /health 200, argv, env, GPUs.

    A login that becomes root (ansible_become) needs sudo without a password here: testinfra runs
    `sudo` with no way to answer its prompt (-K is refused).
    """
    from orchestrator.hosts import pd, status_play
    from orchestrator.hosts.inventory import hosts as inventory_hosts
    from orchestrator.hosts.inventory import no_match
    from orchestrator.hosts.verify.run import verify as run_verify

    refs = list(profile_refs)
    inv = inventory_or_lab(inventory)
    if not refs:
        rows = status_play.status(inv, limit=limit)
        fleet = {h.name for h in inventory_hosts(inv, limit) if h.pd_role}
        rows = [r for r in rows if r.host in fleet] or rows  # a PD fleet: the hosts of its groups
        deployed = sorted({r.profile for r in rows})
        pair = len(deployed) == 2 and all(r.pd for r in rows)  # a PD fleet: one profile per role
        if not deployed or "" in deployed or not (len(deployed) == 1 or pair):
            raise InputError(f"hosts run different or no profiles ({deployed}); give --profile")
        refs = deployed
    profs = pd.ordered([_deployed_profile(ref, bool(profile_refs)) for ref in refs])
    profile_ref = "+".join(p.name for p in profs)
    if len(profs) > 1:  # a PD pair: --limit may select one role's hosts only
        roles = {h.pd_role for h in inventory_hosts(inv, limit)}
        profs = [p for p in profs if p.disaggregation is None or p.disaggregation.mode in roles] or profs
    checks = [c for p in profs for c in run_verify(p, inv, limit)]
    if not checks:
        raise no_match(inv, limit)
    if as_json:
        click.echo(json.dumps({"profile": profile_ref, "checks": [c.__dict__ for c in checks]}, indent=2))
        sys.exit(0 if all(c.passed for c in checks) else 1)
    table = Table(title=f"verify {shown(profile_ref)}", title_justify="left")
    for col in ("host", "check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for c in checks:
        result = plain("pass", "green") if c.passed else plain("FAIL", "bold red")
        table.add_row(shown(c.host), shown(c.check), result, shown(c.message, keep="\n"))
    out.print(table)
    sys.exit(0 if all(c.passed for c in checks) else 1)
