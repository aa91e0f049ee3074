"""`logs`: the unit's journal from each host, one line per entry, prefixed by its host.

A server's journal is the server's text, printed as data. Control characters other than tab
are escaped (shown). So a logged ESC sequence (a colour code, a new window title) is seen as
written and never drives the terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from orchestrator.cli import params
from orchestrator.cli.console import (
    handle_errors,
    inventory_option,
    inventory_or_running_lab,
    limit_option,
    shown,
    unit_option,
)
from orchestrator.hosts import logs_play
from orchestrator.hosts.runner import PlayCanceled

# Log text is printed as data: no markup, no emoji codes, no highlighting, no wrapping at 80 columns.
out = Console(highlight=False, markup=False, emoji=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)


def format_line(line: logs_play.LogLine, width: int) -> Iterable[Text]:
    """`host  HH:MM:SS.mmm | message` in local time; a multi-line message keeps the prefix on each line."""
    stamp = line.time.astimezone().strftime("%H:%M:%S.%f")[:-3]
    for part in line.message.splitlines() or [""]:
        text = Text(shown(line.host).ljust(width), style="cyan")
        text.append(f" {stamp} | ", style="dim")
        text.append(shown(part, keep="\t"))
        yield text


class _Printer:
    """Prints batches with one host column width, and each host failure once until it changes."""

    def __init__(self) -> None:
        self.width = 0
        self.reported: dict[str, str] = {}
        self.failed = False

    def show(self, batch: logs_play.LogBatch) -> None:
        self.width = max([self.width, *(len(shown(h)) for h in batch.hosts)])
        for line in batch.lines:
            for text in format_line(line, self.width):
                out.print(text)
        current = {f.host: f for f in batch.failures}
        for host, failure in current.items():
            if self.reported.get(host) != failure.message:
                what = "unreachable" if failure.unreachable else "journal not read"
                err.print(Text(shown(f"{host}: {what}: {failure.message}"), style="red"))
        self.reported = {h: f.message for h, f in current.items()}
        self.failed = self.failed or bool(current)


@click.command()
@inventory_option("the local lab, when it is up")
@limit_option()
@unit_option
@click.option(
    "--lines",
    "-n",
    # journalctl reads -n as a C unsigned int
    type=params.Integer(0, 2**31 - 1),
    default=40,
    show_default=True,
    help="Last N lines per host.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines, about every second, to Ctrl-C.")
@click.option("--since", metavar="TIME", help='journalctl\'s syntax: "10 min ago", "2026-11-29 13:00".')
@handle_errors
def logs(
    inventory: Path | None, limit: str | None, unit_name: str, lines: int, follow: bool, since: str | None
) -> None:
    """The unit's journal from each host, merged in time order, each line prefixed by its host."""
    printer = _Printer()
    inv = inventory_or_running_lab(inventory)
    if follow:
        batches = logs_play.follow(inv, unit_name=unit_name, lines=lines, since=since, limit=limit)
        _follow(printer, batches)
    printer.show(logs_play.read(inv, unit_name=unit_name, lines=lines, since=since, limit=limit))
    sys.exit(1 if printer.failed else 0)


def _follow(printer: _Printer, batches: Iterable[logs_play.LogBatch]) -> None:
    """Print batches until Ctrl-C, which is how a user ends --follow, so it exits 0.

    Ctrl-C between plays is a KeyboardInterrupt; during one, ansible-runner cancels the play.
    """
    try:
        for i, batch in enumerate(batches):
            printer.show(batch)
            if i == 0:  # from here on, every new line is printed
                err.print(f"following {len(batch.hosts)} host(s); Ctrl-C stops", style="dim")
    except (KeyboardInterrupt, PlayCanceled):
        sys.exit(0)
