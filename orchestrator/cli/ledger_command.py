"""`ledger`: which ledger this machine records in, and moving a SQLite ledger into a team's.

`--ledger URL` (before the command) or $ORCHESTRATOR_LEDGER picks the ledger; the SQLite file in the
state directory is the default.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.table import Table

from orchestrator.cli.console import handle_errors, out, shown


@click.group()
def ledger() -> None:
    """The ledger: every deploy, bench run, campaign and good unit. A SQLite file on this machine
    (the default), or one PostgreSQL that a team's control machines share: --ledger URL before the
    command, or $ORCHESTRATOR_LEDGER."""


@ledger.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
@handle_errors
def status(as_json: bool) -> None:
    """Which ledger, its schema version, its rows per table, and the machines that write it.
    It only reads: it never creates or migrates a ledger."""
    from orchestrator.ledger import team

    found = team.status()
    if as_json:
        click.echo(json.dumps(found.as_json(), indent=2))
        return
    out.print(f"ledger   {shown(found.ledger)} ({found.engine}, from {found.source})")
    if not found.exists:
        out.print("         none yet: the first command that records (deploy, bench, tune) makes it")
        return
    behind = " (a command that records migrates it)" if found.version < found.newest else ""
    out.print(f"schema   version {found.version}, this orchestrator's newest {found.newest}{behind}")
    if found.ledger_id:
        out.print(f"id       {found.ledger_id}")
    table = Table(title="rows", title_justify="left")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, count in found.rows.items():
        table.add_row(name, f"{count:,}")
    out.print(table)
    if found.machines:
        machines = Table(title="machines that record here", title_justify="left")
        machines.add_column("machine")
        machines.add_column("last recorded")
        for machine, when in sorted(found.machines.items(), key=lambda kv: -kv[1]):
            machines.add_row(shown(machine), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)))
        out.print(machines)


@ledger.command("push")
@click.argument("url")
@click.option(
    "--from",
    "source",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The SQLite ledger to copy. Default: this machine's (STATE/ledger.sqlite).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was copied as JSON.")
@handle_errors
def push(url: str, source: Path | None, as_json: bool) -> None:
    """Copy a SQLite ledger into the ledger at URL (a team's PostgreSQL), each row once.

    A second push adds nothing but the rows recorded since. Rows keep the machine that wrote them.
    A campaign pushed can be resumed from any machine that records in URL.
    """
    from orchestrator import ledger as ledger_mod
    from orchestrator.ledger import store, team

    done = team.push(source or ledger_mod.path(), store.parse(url, "the push's URL"))
    if as_json:
        click.echo(json.dumps(done.as_json(), indent=2))
        return
    table = Table(title=f"pushed {shown(done.source)} into {shown(done.target)}", title_justify="left")
    for column in ("table", "copied", "already there"):
        table.add_column(column, justify="left" if column == "table" else "right")
    for name, copied in done.copied.items():
        table.add_row(name, f"{copied:,}", f"{done.had[name]:,}")
    out.print(table)
