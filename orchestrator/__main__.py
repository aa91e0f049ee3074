"""The command line: the one place that prints and picks exit codes (0 ok, 1 a host failed, 2 bad input,
an unusable state directory or ledger included)."""

from __future__ import annotations

import getpass
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from orchestrator import console, sglang_flags, systemd_check
from orchestrator import plan as plan_mod
from orchestrator import profile as profile_mod
from orchestrator.console import (
    err,
    handle_errors,
    inventory_or_lab,
    inventory_or_running_lab,
    out,
    plain,
    shown,
)
from orchestrator.errors import InputError, Problem, ProfileError
from orchestrator.paths import EXAMPLES_DIR


class LazyGroup(click.Group):
    """Commands kept in other modules load only when run (or listed): `deploy` need not import
    the bench client (httpx, asyncio) or the lab. Click's own recipe for lazy subcommands."""

    LAZY = {
        "logs": "orchestrator.logs_cli:logs",
        "bench": "orchestrator.bench_cli:bench",
        "sweep": "orchestrator.bench_cli:sweep",
        "results": "orchestrator.bench_cli:results",
        "tune": "orchestrator.tune_cli:tune",
        "lab": "orchestrator.lab.cli:lab",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.LAZY:
            command = super().get_command(ctx, cmd_name)
        else:
            module, _, attr = self.LAZY[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
        if cmd_name in BECOME_COMMANDS and command is not None:
            _add_become_option(command, refuse=cmd_name == "verify")
        if cmd_name in VAULT_COMMANDS and command is not None:
            _add_vault_options(command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Each command handles its own errors (handle_errors); this catches what fails before one
        runs, such as an option's callback reading a file, so no input ends in a traceback."""
        return handle_errors(super().invoke)(ctx)


#: The commands that run plays against hosts: each takes -K/--ask-become-pass, given here once for all
#: (the option sets what every play of the command answers, so no command passes it along itself).
BECOME_COMMANDS = frozenset(
    {"deploy", "preflight", "rollback", "status", "stop", "verify", "logs", "bench", "sweep", "tune"}
)


def _add_become_option(command: click.Command, refuse: bool) -> None:
    if any(param.name == "ask_become_pass" for param in command.params):
        return
    help_text = (
        "Refused: testinfra cannot answer sudo's password prompt, so verify needs a login whose sudo "
        "asks none (NOPASSWD), or root."
        if refuse
        else "Ask once for the password sudo wants on the hosts (Ansible's become password)."
    )
    option = click.Option(
        ["-K", "--ask-become-pass"],
        is_flag=True,
        expose_value=False,
        callback=_refuse_become_pass if refuse else _ask_become_pass,
        help=help_text,
    )
    command.params.append(option)


def _ask_become_pass(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """-K (or become_ask_pass in ansible.cfg): the password, read from the terminal without echo, answers
    every play's become prompt."""
    if ctx.resilient_parsing or not (value or _configured(ctx, "DEFAULT_BECOME_ASK_PASS")):
        return
    from orchestrator import runner

    password = getpass.getpass("BECOME password: ")
    if not password:
        raise click.BadParameter("the become password is empty", ctx, param)
    runner.use_become_password(password)


def _refuse_become_pass(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        raise click.BadParameter(
            "verify cannot use a become password: testinfra's ansible backend runs `sudo` with no way "
            "to answer its prompt. Verify as a login whose sudo asks no password (NOPASSWD), or as root.",
            ctx,
            param,
        )


#: The commands that read the inventory: each takes Ansible's vault options, given here once for all
#: (like -K, they set what every inventory read and play of the command decrypts with).
VAULT_COMMANDS = BECOME_COMMANDS | {"plan"}


def _add_vault_options(command: click.Command) -> None:
    if any(param.name == "vault_id" for param in command.params):
        return
    command.params += [
        click.Option(
            ["--vault-id"],
            multiple=True,
            metavar="[LABEL@]FILE|prompt",
            expose_value=False,
            callback=_vault_ids,
            help="A vault password as ansible-playbook takes it: a file (or script) to read, or `prompt` "
            "to ask once. Repeatable.",
        ),
        click.Option(
            ["--vault-password-file"],
            multiple=True,
            metavar="FILE",
            type=click.Path(exists=True, dir_okay=False),
            expose_value=False,
            callback=_vault_password_files,
            help="A file (or script) holding the vault password. Repeatable. Also: "
            "ANSIBLE_VAULT_PASSWORD_FILE, vault_password_file in ansible.cfg.",
        ),
        click.Option(
            ["-J", "--ask-vault-pass"],
            is_flag=True,
            expose_value=False,
            callback=_ask_vault_pass,
            help="Ask once for the vault password.",
        ),
    ]


def _vault_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
    """--vault-id: a `prompt` one is asked now (once per label), a file is read when a vault needs it."""
    if ctx.resilient_parsing:
        return
    from orchestrator import vault

    for slug in values:
        label, source = vault.split_vault_id(slug)
        password = ""
        if source in vault.PROMPT_SOURCES:
            password = _typed_vault_password(ctx, param, vault.prompt_for(label or vault.default_id()))
        vault.use_vault_id(slug, password)


def _vault_password_files(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
    if ctx.resilient_parsing:
        return
    from orchestrator import vault

    for path in values:
        vault.use_password_file(path)


def _ask_vault_pass(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """-J (or ask_vault_pass in ansible.cfg), and the `LABEL@prompt` ids of ansible.cfg's
    vault_identity_list: each password is asked once, without echo, and answers every play's prompt."""
    if ctx.resilient_parsing:
        return
    from orchestrator import vault

    if value or _configured(ctx, "DEFAULT_ASK_VAULT_PASS"):
        vault.use_typed_password(_typed_vault_password(ctx, param, vault.prompt_for(None)))
    try:
        configured = vault.prompts_configured()
    except InputError as exc:
        raise click.UsageError(str(exc), ctx) from None
    for vault_id in configured:
        if not vault.typed(vault_id):
            password = _typed_vault_password(ctx, param, vault.prompt_for(vault_id))
            vault.use_configured_prompt(vault_id, password)


def _typed_vault_password(ctx: click.Context, param: click.Parameter, prompt: str) -> str:
    password = getpass.getpass(prompt)
    if not password:
        raise click.BadParameter("the vault password is empty", ctx, param)
    return password


def _configured(ctx: click.Context, setting: str) -> bool:
    """Whether the user's Ansible configuration turns `setting` on (ansible.cfg, ANSIBLE_*)."""
    from orchestrator import ansible_config

    try:
        return bool(ansible_config.read()[setting].value)
    except InputError as exc:  # an ansible.cfg Ansible cannot read: a usage error, before any play
        raise click.UsageError(str(exc), ctx) from None


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="orchestrator")
@click.option(
    "--profiles-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="Folder of profiles (NAME.yml) that -p NAME looks in. Default: $ORCHESTRATOR_PROFILES, "
    "else ./profiles/.",
)
def cli(profiles_dir: Path | None) -> None:
    """Deploy and restart SGLang servers (EAGLE-3 speculative decoding) on GPU hosts.

    A profile is NAME (NAME.yml in the profiles folder: --profiles-dir, else $ORCHESTRATOR_PROFILES,
    else ./profiles/), example:NAME (an example shipped with orchestrator) or a YAML file's path;
    `profiles` lists them, `render` shows the exact systemd unit a host would get.
    """
    profile_mod.use_profiles_dir(profiles_dir)


profile_option = click.option(
    "--profile",
    "-p",
    "profile_ref",
    metavar="NAME|PATH",
    help="Profile name from the profiles folder, example:NAME, or a YAML file.",
)


@cli.command()
@profile_option
@handle_errors
def validate(profile_ref: str | None) -> None:
    """Validate one profile, or every profile `profiles` lists when none is given."""
    refs = [profile_ref] if profile_ref is not None else list(profile_mod.every())
    problems = []
    skipped = ""
    for ref in refs:
        try:
            prof = profile_mod.load(ref)
            plan = plan_mod.build(prof)
            verdict = systemd_check.require(prof, [plan])  # systemd's own reading, where it is here
        except InputError as exc:  # ProfileError, or a file that does not load (bad YAML)
            problems += exc.problems if isinstance(exc, ProfileError) else [Problem("error", "", str(exc))]
            continue
        skipped = verdict.skipped
        label = ref if ref.startswith(profile_mod.EXAMPLE) else prof.name
        out.print(f"ok: {shown(label)} ({_spec_summary(prof)}, digest {plan.digest})")
        for note in profile_mod.notes(prof):
            click.echo(f"note: {shown(label)}: {shown(note)}", err=True)
    if skipped:
        click.echo(f"note: {shown(skipped)}", err=True)
    if problems:
        raise ProfileError(problems)


@cli.command()
@click.option(
    "--profile", "-p", "profile_ref", metavar="NAME|PATH", required=True, help="Profile name or file."
)
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"argv": [...], "environment": {...}, "unit": "..."}.'
)
@click.option(
    "--against",
    metavar="NAME|PATH",
    help="Print only the SGLang flags and environment variables that differ from this profile's.",
)
@handle_errors
def render(profile_ref: str, as_json: bool, against: str | None) -> None:
    """Print the systemd unit the profile renders to, byte for byte what a host gets."""
    prof = profile_mod.load(profile_ref)
    notes = [sglang_flags.help_note(prof.server.sglang_version), *profile_mod.notes(prof)]
    plan = plan_mod.build(prof)
    verdict = systemd_check.require(prof, [plan])
    if verdict.skipped:
        notes.append(verdict.skipped)
    for note in filter(None, notes):  # on stderr: stdout stays the unit's exact bytes
        click.echo(f"note: {shown(note)}", err=True)
    if against:
        other = plan_mod.build(profile_mod.load(against))
        changes = plan_mod.flag_changes(other.unit, plan.unit)
        if as_json:
            click.echo(json.dumps({"from": other.profile, "to": plan.profile, "changes": changes}, indent=2))
            return
        click.echo(f"{shown(other.profile)} -> {shown(plan.profile)}: {len(changes) or 'no'} change(s)")
        for line in changes:  # values as the profiles wrote them: an ESC in one is shown as \x1b
            click.echo(f"  {shown(line)}")
        return
    if as_json:
        click.echo(plan_mod.dumps(plan))
    else:
        click.echo(plan.unit, nl=False)


def _spec_summary(prof: profile_mod.Profile) -> str:
    spec = prof.speculative
    if spec.algorithm is None:
        return "no speculation"
    if spec.num_steps is None:
        return f"{spec.algorithm}, SGLang's defaults"
    tree = f"{spec.num_steps} steps x top-k {spec.eagle_topk}"
    return f"{spec.algorithm} {tree}, {spec.num_draft_tokens} draft tokens"


@cli.command()
@handle_errors
def profiles() -> None:
    """List the profiles -p finds by name: the profiles folder's, then the shipped examples."""
    folder, label = profile_mod.profiles_dir()
    table = Table(
        title="profiles",
        caption=f"profiles folder: {shown(label)}{'' if folder.is_dir() else ', not found'}; "
        f"shipped examples (example:NAME): {shown(EXAMPLES_DIR)}",
        caption_justify="left",
    )
    for col in ("name", "from", "extends", "algorithm", "steps/top-k/draft", "CUDA graphs"):
        table.add_column(col, no_wrap=True)
    table.add_column("description", overflow="fold")
    problems = []
    for name in profile_mod.every():
        source = "shipped" if name.startswith(profile_mod.EXAMPLE) else "folder"
        try:
            prof = profile_mod.load(name)
        except InputError as exc:  # ProfileError, or a file that does not load (bad YAML)
            problems += exc.problems if isinstance(exc, ProfileError) else [Problem("error", "", str(exc))]
            table.add_row(shown(name), source, "", "", "", "", plain("invalid: run `validate`", "red"))
            continue
        spec = prof.speculative
        trio = "/".join(str(v) for v in (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens))
        table.add_row(
            shown(name),
            source,
            shown(prof.extends or ""),
            spec.algorithm or "-",
            trio if spec.num_steps is not None else "-",
            "on" if prof.server.cuda_graph else "off",
            shown(prof.description),
        )
    out.print(table)
    if problems:
        raise ProfileError(problems)


@cli.command()
@click.argument("kind", type=click.Choice(["profile", "space"]), default="profile")
def schema(kind: str) -> None:
    """Print the JSON Schema of a profile file (or of a `tune` space file), for editors."""
    if kind == "space":
        from orchestrator import space

        click.echo(json.dumps(space.Space.model_json_schema(), indent=2))
    else:
        click.echo(json.dumps(profile_mod.Profile.model_json_schema(), indent=2))


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
        type=click.FloatRange(0, 86400),
        default=120,
        show_default=True,
        help="Seconds to wait for another deploy's lock on a host.",
    ),
    click.option(
        "--serial", metavar="N|P%", help="Deploy in batches of N hosts (or P% of them), each healthy first."
    ),
    click.option(
        "--max-fail-percent",
        type=click.IntRange(0, 100),
        help="Start no further batch once more than this percent of a batch failed (implies --serial 1).",
    ),
    click.option(
        "--no-preflight",
        is_flag=True,
        help="Skip the read-only checks before a restart (to debug a failing start).",
    ),
    click.option(
        "--no-drain",
        is_flag=True,
        help="Behind a gateway (orchestrator_gateway_url): restart under traffic, without taking "
        "each batch out of its rotation first.",
    ),
    click.option(
        "--drain-timeout",
        type=click.FloatRange(0, 86400),
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
        "drain": not no_drain,
        "drain_timeout_s": drain_timeout,
    }


@cli.command()
@profile_option
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
    type=click.IntRange(1, 5000),
    help="Hosts Ansible works on at once (ansible-playbook --forks). Default: ansible.cfg's forks, else 20.",
)
@click.option(
    "--canary", is_flag=True, help="Deploy and bench the first host; the rest only if tok/s held up."
)
@click.option(
    "--canary-margin",
    type=click.FloatRange(0, 1),
    default=0.05,
    show_default=True,
    help="Largest tok/s drop (fraction) the canary may show against the profile it replaced.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def deploy(
    profile_ref: str,
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
    """
    from orchestrator import deploy as deploy_mod

    prof = profile_mod.load(profile_ref)  # fail on a bad profile before touching the lab
    options = deploy_mod.Options(**_rollout(**rollout), check=check, rollback=not no_rollback, forks=forks)
    inv = inventory_or_lab(inventory)
    title = f"{'check' if check else 'deploy'} {prof.name} -> {inv}"
    if canary and not check:
        _show(lambda on_event: _canary(prof, inv, options, canary_margin, on_event), title, as_json)
        return
    _show(lambda on_event: deploy_mod.deploy(prof, inv, options, on_event), title, as_json, check)


@cli.command("plan")
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

    from orchestrator import deploy as deploy_mod
    from orchestrator.runner import write_private
    from orchestrator.secrets import secret_bundle

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


def _canary(prof: profile_mod.Profile, inv: Path, options: Any, margin: float, on_event: Any) -> Any:
    """The canary's verdict on stderr, then the usual report (failed when it was rejected)."""
    from orchestrator import bench as bench_mod
    from orchestrator.canary import canary_deploy

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


def _json_progress(ev: Any) -> None:
    """deploy --json: each start-up report as one JSON line on stderr (stdout keeps the one result)."""
    from orchestrator import view

    data = view.start_event(ev)
    if data is not None:
        click.echo(json.dumps(data), err=True)


def _show(run: Callable[..., Any], title: str, as_json: bool, check: bool = False) -> None:
    """Run a deploy-shaped action with the live view (quietly for --json), print the outcome, exit."""
    from orchestrator import view

    if as_json:
        report = run(_json_progress)
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        with view.LiveHosts(err, shown(title)) as live:
            report = run(live.event)
        if check:
            out.print(view.check_details(report))
        out.print(view.deploy_table(report))
        out.print(view.startup_lines(report))
        out.print(view.gateway_steps(report))
        out.print(view.failures(report))
    if report.interrupted:
        sys.exit(130)  # as a shell reports a command ended by Ctrl-C
    sys.exit(0 if report.ok else 1)


@cli.command()
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
    from orchestrator import hostops

    prof = profile_mod.load(profile_ref)
    results = hostops.preflight(prof, inventory_or_lab(inventory), limit)
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
    sys.exit(0 if results and all(r.ok for r in results) else 1)


@cli.command()
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
    from orchestrator import rollback as rollback_mod

    inv = inventory_or_lab(inventory)
    title = f"rollback{f' to {to_profile}' if to_profile else ''} -> {inv}"
    _show(lambda on_event: rollback_mod.rollback(inv, unit_name, limit, to_profile, on_event), title, as_json)


@cli.command()
@click.option("--host", help="Only this host.")
@click.option(
    "--last",
    "-n",
    "count",
    type=click.IntRange(1, 10000),
    default=30,
    show_default=True,
    help="The newest N rows.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def history(host: str | None, count: int, as_json: bool) -> None:
    """The deploys recorded in the local ledger, newest first: host, profile, result, duration, and
    where each start went (its longest phases)."""
    from orchestrator import ledger, startup

    rows = [dict(r) for r in ledger.history(host, count)]
    for r in rows:
        r["phases"] = startup.phases_of(r.get("phases", "[]"))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"history ({shown(ledger.path())})", title_justify="left")
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
    ):
        table.add_column(col, overflow="fold")
    for r in rows:  # each row's columns hold what the schema says: ledger.history skips others
        table.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])),
            *(shown(r[column]) for column in ("host", "action", "profile", "digest")),
            plain(r["result"], "red" if r["result"] == "failed" else ""),
            "yes" if r["restarted"] else "no",
            f"{r['duration_s']:.1f} s",
            plain(startup.longest(r["phases"])),
            shown(r["diagnosis"]),
        )
    out.print(table)


@cli.command()
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
    from orchestrator import hostops, view

    rows = hostops.status(inventory_or_lab(inventory), unit_name=unit_name, limit=limit)
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


@cli.command()
@inventory_option
@limit_option
@unit_option
@handle_errors
def stop(inventory: Path | None, limit: str | None, unit_name: str) -> None:
    """Stop the server and confirm the GPUs are released."""
    from orchestrator import hostops

    reports = hostops.stop(inventory_or_running_lab(inventory), unit_name=unit_name, limit=limit)
    for r in reports:
        if r.ok:
            out.print(f"{shown(r.host)}: stopped, GPUs released ({r.elapsed_s:.1f} s)")
        else:
            err.print(f"{shown(r.host)}: failed at {shown(r.step)}: {shown(r.message)}", style="red")
    sys.exit(0 if all(r.ok for r in reports) else 1)


@cli.command()
@click.option(
    "--profile", "-p", "profile_ref", metavar="NAME|PATH", help="Default: the profile the hosts run."
)
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@handle_errors
def verify(profile_ref: str | None, inventory: Path | None, limit: str | None, as_json: bool) -> None:
    """Check hosts with testinfra: unit equals the plan, service active, /health 200, argv, env, GPUs.

    A login that becomes root (ansible_become) needs sudo without a password here: testinfra runs
    `sudo` with no way to answer its prompt (-K is refused).
    """
    from orchestrator import hostops
    from orchestrator.inventory import no_match
    from orchestrator.verify.run import verify as run_verify

    prof = profile_mod.load(profile_ref) if profile_ref is not None else None
    inv = inventory_or_lab(inventory)
    if prof is None:
        deployed = {r.profile for r in hostops.status(inv, limit=limit)}
        if len(deployed) != 1 or "" in deployed:
            raise InputError(f"hosts run different or no profiles ({sorted(deployed)}); give --profile")
        profile_ref = deployed.pop()
        try:
            prof = profile_mod.load(profile_ref)
        except InputError:
            raise InputError(
                f"the hosts run profile {profile_ref!r}, which is not in {profile_mod.profiles_dir()[1]} "
                f"(deployed from a file, or as {profile_mod.EXAMPLE}NAME?); give it as --profile PATH "
                "or --profile example:NAME"
            ) from None
    checks = run_verify(prof, inv, limit)
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


def main() -> None:
    cli(prog_name="orchestrator")


if __name__ == "__main__":
    main()
