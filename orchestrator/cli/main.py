"""The `orchestrator` command group: its global options, and each command by the module that holds it.

The command line is the one place that prints and picks exit codes. 0 is ok, 1 a host failed, and 2
bad input. An unusable state directory or ledger counts as bad input.
"""

from __future__ import annotations

import getpass
import importlib
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.console import handle_errors
from orchestrator.errors import InputError
from orchestrator.profile import model as profile_mod


class LazyGroup(click.Group):
    """Every command, by the module that holds it. A module loads only when its command runs or
    is listed: `deploy` need not import the bench client (httpx, asyncio) or the lab. Click's own
    recipe for lazy subcommands: click calls list_commands and get_command."""

    LAZY = {
        "validate": "orchestrator.cli.profile_commands:validate",
        "render": "orchestrator.cli.profile_commands:render",
        "profiles": "orchestrator.cli.profile_commands:profiles",
        "schema": "orchestrator.cli.profile_commands:schema",
        "adopt": "orchestrator.cli.adopt_command:adopt",
        "deploy": "orchestrator.cli.host_commands:deploy",
        "plan": "orchestrator.cli.host_commands:plan_command",
        "preflight": "orchestrator.cli.host_commands:preflight",
        "rollback": "orchestrator.cli.host_commands:rollback",
        "history": "orchestrator.cli.host_commands:history",
        "status": "orchestrator.cli.host_commands:status",
        "stop": "orchestrator.cli.host_commands:stop",
        "verify": "orchestrator.cli.host_commands:verify",
        "logs": "orchestrator.cli.logs_command:logs",
        "bench": "orchestrator.cli.bench_commands:bench",
        "sweep": "orchestrator.cli.bench_commands:sweep",
        "results": "orchestrator.cli.bench_commands:results",
        "tune": "orchestrator.cli.tune_command:tune",
        "lab": "orchestrator.cli.lab_command:lab",
        "ledger": "orchestrator.cli.ledger_command:ledger",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.LAZY)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.LAZY:
            return None
        module, _, attr = self.LAZY[cmd_name].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        if cmd_name in BECOME_COMMANDS:
            _add_become_option(command, refuse=cmd_name == "verify")
        if cmd_name in VAULT_COMMANDS:
            _add_vault_options(command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Each command handles its own errors (handle_errors); this catches what fails before one
        runs, such as an option's callback reading a file, so no input ends in a traceback."""
        return handle_errors(super().invoke)(ctx)


#: The commands that run plays against hosts: each takes -K/--ask-become-pass, given here once for all
#: (the option sets what every play of the command answers, so no command passes it along itself).
BECOME_COMMANDS = frozenset(
    {"adopt", "deploy", "preflight", "rollback", "status", "stop", "verify", "logs", "bench", "sweep", "tune"}
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
    from orchestrator.hosts import runner

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
    from orchestrator.hosts import vault

    for slug in values:
        label, source = vault.split_vault_id(slug)
        password = ""
        if source in vault.PROMPT_SOURCES:
            password = _typed_vault_password(ctx, param, vault.prompt_for(label or vault.default_id()))
        vault.use_vault_id(slug, password)


def _vault_password_files(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
    if ctx.resilient_parsing:
        return
    from orchestrator.hosts import vault

    for path in values:
        vault.use_password_file(path)


def _ask_vault_pass(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """-J (or ask_vault_pass in ansible.cfg), and the `LABEL@prompt` ids of ansible.cfg's
    vault_identity_list: each password is asked once, without echo, and answers every play's prompt."""
    if ctx.resilient_parsing:
        return
    from orchestrator.hosts import vault

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
    from orchestrator.hosts import ansible_config

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
@click.option(
    "--ledger",
    "ledger_url",
    metavar="URL",
    help="The ledger to record in and read: postgresql://USER@HOST:PORT/DB (a team's), or a SQLite "
    "file. Default: $ORCHESTRATOR_LEDGER, else STATE/ledger.sqlite.",
)
def cli(profiles_dir: Path | None, ledger_url: str | None) -> None:
    """Deploy and restart SGLang servers (EAGLE-3 speculative decoding) on GPU hosts.

    A profile is NAME (NAME.yml in the profiles folder: --profiles-dir, else $ORCHESTRATOR_PROFILES,
    else ./profiles/), example:NAME (an example shipped with orchestrator) or a YAML file's path;
    `profiles` lists them, `render` shows the exact systemd unit a host would get.
    """
    profile_mod.use_profiles_dir(profiles_dir)
    if ledger_url is not None:
        if not ledger_url.strip():
            raise click.BadParameter("give the ledger's URL, or leave --ledger out", param_hint="--ledger")
        from orchestrator.ledger import store

        store.use(ledger_url)


def main() -> None:
    cli(prog_name="orchestrator")


if __name__ == "__main__":
    main()
