"""`bench`, `sweep`, `results`: the tuning loop's commands, the one place their output is decided.

Kept out of __main__.py, which loads this module only when one of these commands runs (its
LazyGroup): deploy need not import the bench client.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from orchestrator import bench as bench_mod
from orchestrator import console, ledger
from orchestrator import profile as profile_mod
from orchestrator import sweep as sweep_mod
from orchestrator.console import (
    err,
    handle_errors,
    inventory_or_lab,
    inventory_or_running_lab,
    out,
    plain,
    shown,
)
from orchestrator.errors import InputError
from orchestrator.runner import TaskEvent

inventory_option = console.inventory_option("the local lab")
limit_option = console.limit_option("Only hosts matching this pattern; the first one serves HTTP.")


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The load a bench puts on the server (shared by bench and sweep)."""
    options = [
        click.option("--requests", "-n", type=click.IntRange(1, 100000), default=16, show_default=True),
        click.option("--concurrency", "-c", type=click.IntRange(1, 1024), default=1, show_default=True),
        click.option(
            "--max-tokens",
            type=click.IntRange(2, 1_000_000),
            default=256,
            show_default=True,
            help="Per request.",
        ),
        click.option("--warmup", type=click.IntRange(0, 1000), default=2, show_default=True),
        click.option(
            "--prompts",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help='One prompt per line (.jsonl: strings or {"prompt": ...}).',
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _settings(requests: int, concurrency: int, max_tokens: int, warmup: int, prompts: Path | None):
    chosen = bench_mod.load_prompts(prompts) if prompts else bench_mod.DEFAULT_PROMPTS
    return bench_mod.Settings(requests, concurrency, max_tokens, warmup, prompts=chosen)


@contextmanager
def _progress() -> Iterator[tuple[Callable[[str, int, int], None], Callable[[str], None], Callable]]:
    """A progress line on stderr: the phase, and a bar for the requests of a bench."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task("starting", total=None)
    state = {"phase": ""}

    def on_progress(phase: str, done: int, total: int) -> None:
        bar.update(task, description=f"{state['phase']} {phase}".strip(), completed=done, total=total or None)

    def on_phase(text: str) -> None:
        text = shown(text)  # names profiles and hosts
        state["phase"] = text
        err.print(Text.assemble((time.strftime("%H:%M:%S"), "dim"), f" {text}"))
        bar.update(task, description=text, completed=0, total=None)

    def on_event(ev: TaskEvent) -> None:
        from orchestrator.facts import step_of

        if ev.kind == "start" and step_of(ev):
            bar.update(task, description=f"{state['phase']}: {shown(ev.host)} {shown(step_of(ev))}")

    with bar:
        yield on_progress, on_phase, on_event


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def bench_table(r: bench_mod.BenchResult) -> Table:
    t = r.target
    title = (
        f"bench {t.profile or '?'} on {t.host} ({t.url}, digest {t.digest or '?'}, SGLang {r.sglang_version})"
    )
    table = Table(title=shown(title), title_justify="left")  # the host's own words, most of it
    for col in ("metric", "mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    tok = r.tok_s
    table.add_row("decode tok/s per request", *(_num(v) for v in (tok.mean, tok.p50, tok.p90, tok.p99)))
    table.add_row("TTFT ms", *(_ms(v) for v in (r.ttft.mean, r.ttft.p50, r.ttft.p90, r.ttft.p99)))
    table.add_row("inter-token latency ms", *(_ms(v) for v in (r.itl.mean, r.itl.p50, r.itl.p90, r.itl.p99)))
    table.add_section()
    table.add_row("total output tok/s", _num(r.total_tok_s), "", "", "")
    accept = (
        f"{_num(r.accept_len, 2)} (log {_num(r.accept_len_log, 2)}, client {_num(r.accept_len_client, 2)})"
    )
    table.add_row("accept length", accept, "", "", "")
    errors = f"{len(r.errors)} of {len(r.streams)}"
    table.add_row("errors", plain(errors, "red" if r.errors else ""), "", "", "")
    settings = f"{r.settings.requests} x {r.settings.max_tokens} tokens, concurrency {r.settings.concurrency}"
    table.add_row("requests", settings, "", "", "")
    table.add_row("output tokens / wall", f"{r.output_tokens} / {r.duration_s:.1f} s", "", "", "")
    return table


@click.command()
@click.option("--profile", "-p", "profile_ref", metavar="NAME|PATH", help="Expected profile (checked).")
@inventory_option
@limit_option
@load_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def bench(
    profile_ref: str | None,
    inventory: Path | None,
    limit: str | None,
    requests: int,
    concurrency: int,
    max_tokens: int,
    warmup: int,
    prompts: Path | None,
    as_json: bool,
) -> None:
    """Measure the deployed server: decode tok/s, TTFT, inter-token latency, accept length, errors.

    Runs against the first host of the inventory (or --limit), records a row in the ledger.
    """
    settings = _settings(requests, concurrency, max_tokens, warmup, prompts)
    inv = inventory_or_running_lab(inventory)
    prof = profile_mod.load(profile_ref) if profile_ref else None
    target = bench_mod.find_target(inv, limit, prof)
    log = bench_mod.journal_messages(inv, target.host)
    if as_json:
        result = bench_mod.run(target, settings, None, log)
    else:
        with _progress() as (on_progress, on_phase, _):
            on_phase(f"bench {target.profile or '?'} on {target.host}")
            result = bench_mod.run(target, settings, on_progress, log)
    row_id = bench_mod.record(result)
    if as_json:
        click.echo(json.dumps({"ledger_id": row_id, **result.row()}, indent=2))
        return
    out.print(bench_table(result))
    line = standing_line(result)
    if line:
        out.print(shown(line))
    for note in result.notes:
        err.print(plain(f"note: {note}", "yellow"))


def standing_line(result: bench_mod.BenchResult) -> str:
    """Where this run stands among the host's benches in the ledger: against baseline, and the fastest."""
    host, mean = result.target.host, result.tok_s.mean
    base, best = sweep_mod.standing(host)
    parts = []
    if base and base.mean and mean is not None and result.target.profile != base.profile:
        parts.append(f"{mean / base.mean:.3f}x baseline ({base.mean:.1f} tok/s, {len(base.tok_s)} run(s))")
    if best and best.mean is not None:
        parts.append(f"fastest so far: {best.profile} {best.mean:.1f} tok/s ({len(best.tok_s)} run(s))")
    return f"in the ledger for {host}: " + "; ".join(parts) if parts else ""


def ranking_table(entries: list[sweep_mod.Entry], baseline: str, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("rank", "profile", "tok/s", "min..max", "runs", "speed-up", "accept len", "note"):
        table.add_column(
            col, justify="right" if col in ("tok/s", "speed-up", "accept len", "runs") else "left"
        )
    for rank, e in enumerate(entries, 1):
        if not e.ok:
            table.add_row(
                "-", shown(e.profile), "-", "-", "0", "-", "-", plain(f"failed: {e.diagnosis}", "red")
            )
            continue
        speedup = f"{e.speedup:.3f}x" if e.speedup is not None else "-"
        span = f"{min(e.tok_s):.1f}..{max(e.tok_s):.1f}"
        name = f"{e.profile} (baseline)" if e.profile == baseline else e.profile
        note = plain(e.warning, "bold yellow")
        table.add_row(
            str(rank),
            shown(name),
            f"{e.mean:.1f}",
            span,
            str(len(e.tok_s)),
            speedup,
            _num(e.accept_len, 2),
            note,
        )
    return table


@click.command()
@click.argument("profiles", nargs=-1, metavar="PROFILE...")
@click.option(
    "-p",
    "--profile",
    "more_profiles",
    multiple=True,
    metavar="NAME|PATH",
    help="A profile to sweep, as deploy takes it; repeatable, added after the PROFILE arguments.",
)
@click.option("--baseline", metavar="NAME", help="Speed-ups are against this profile (swept too).")
@click.option(
    "--repeat", type=click.IntRange(1, 100), default=1, show_default=True, help="Benches per profile."
)
@click.option("--leave", metavar="NAME", help="Deploy this profile at the end instead of the fastest.")
@inventory_option
@limit_option
@load_options
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
@handle_errors
def sweep(
    profiles: tuple[str, ...],
    more_profiles: tuple[str, ...],
    baseline: str | None,
    repeat: int,
    leave: str | None,
    inventory: Path | None,
    limit: str | None,
    requests: int,
    concurrency: int,
    max_tokens: int,
    warmup: int,
    prompts: Path | None,
    as_json: bool,
) -> None:
    """Deploy, bench and record each profile; rank them; leave the fastest (or --leave) deployed."""
    profiles = (*profiles, *more_profiles)
    if not profiles:
        raise click.UsageError(
            "name the profiles to sweep: `sweep baseline cg_5tok` or `sweep -p baseline -p cg_5tok`"
        )
    settings = _settings(requests, concurrency, max_tokens, warmup, prompts)
    loaded = sweep_mod.load_profiles(
        [*profiles, *([baseline] if baseline else []), *([leave] if leave else [])]
    )
    inv = inventory_or_lab(inventory)
    with _progress() as (on_progress, on_phase, on_event):
        report = sweep_mod.sweep(
            loaded,
            profiles,
            inv,
            limit=limit,
            baseline=baseline,
            repeat=repeat,
            leave=leave,
            settings=settings,
            on_event=on_event,
            on_progress=on_progress,
            on_phase=on_phase,
        )
    if as_json:
        click.echo(json.dumps(_sweep_json(report), indent=2))
    else:
        out.print(ranking_table(report.entries, report.baseline, shown(f"sweep {report.sweep_id} on {inv}")))
        if report.left_ok:
            out.print(f"left deployed: {shown(report.left)}")
        else:
            err.print(plain(f"not restored: {report.left or '-'}: {report.left_message}", "red"))
    sys.exit(0 if report.left_ok and all(e.ok for e in report.entries) else 1)


def _sweep_json(report: sweep_mod.SweepReport) -> dict[str, Any]:
    entries = [
        {
            "profile": e.profile,
            "ok": e.ok,
            "tok_s": e.tok_s,
            "mean_tok_s": e.mean,
            "speedup": e.speedup,
            "accept_len": e.accept_len,
            "warning": e.warning,
            "diagnosis": e.diagnosis,
        }
        for e in report.entries
    ]
    return {
        "sweep_id": report.sweep_id,
        "baseline": report.baseline,
        "ranking": entries,
        "left": report.left,
        "left_ok": report.left_ok,
        "left_message": report.left_message,
    }


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float | None = None) -> float:
    """`30m`, `2h`, `7d` ago, or a local date/time (`2026-11-29`, `2026-11-29 14:00`), as epoch seconds."""
    match = _RELATIVE.match(text.strip())
    if match:
        return (now if now is not None else time.time()) - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise InputError(f"--since {text!r}: give 30m, 2h, 7d or a date such as 2026-11-29 14:00") from None


def results_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"bench results ({shown(ledger.path())})", title_justify="left")
    heads = ("time", "host", "profile", "digest", "SGLang", "tok/s", "total tok/s", "TTFT p50 ms")
    heads += ("ITL p50 ms", "accept len", "errors", "commit", "diagnosis / notes")
    for col in heads:
        table.add_column(col, overflow="fold")
    for r in rows:  # each row's columns hold what the schema says: ledger.bench_results skips others
        failed = r["result"] != "ok"
        table.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])),
            *(shown(r[column]) for column in ("host", "profile", "digest", "sglang_version")),
            plain("failed", "red") if failed else _num(r["tok_s"]),
            _num(r["total_tok_s"]),
            _ms(r["ttft_p50_s"]),
            _ms(r["itl_p50_s"]),
            _num(r["accept_len"], 2),
            str(r["errors"]),
            shown(r["git_commit"][:10]),
            plain(r["diagnosis"] or r["notes"], "red" if failed else "yellow"),
        )
    return table


def _check_plot_folder(plot: Path) -> None:
    try:
        there = plot.parent.is_dir()
    except OSError as exc:  # a name over 255 bytes
        raise InputError(f"--plot {shown(plot)}: {exc.strerror or exc}") from None
    if not there:
        raise InputError(f"--plot {shown(plot)}: no folder {shown(plot.parent)} to write it in")


@click.command()
@click.option("--profile", "-p", "profile", metavar="NAME", help="Only this profile.")
@click.option("--since", metavar="WHEN", help="30m, 2h, 7d, or a date/time such as 2026-11-29 14:00.")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Also draw tok/s to FILE.png.")
@click.option("--baseline", metavar="NAME", default="baseline", show_default=True, help="Line on the plot.")
@handle_errors
def results(profile: str | None, since: str | None, fmt: str, plot: Path | None, baseline: str) -> None:
    """Bench results from the ledger, oldest first: as a table, CSV (every column) or JSON."""
    if plot is not None and importlib.util.find_spec("matplotlib") is None:  # an extra: about 80 MB
        raise InputError(
            "--plot draws with matplotlib, which is not installed: pip install 'orchestrator[plot]' "
            "(under pipx: pipx inject orchestrator matplotlib)"
        )
    if plot is not None:
        _check_plot_folder(plot)  # before printing anything
    rows = [dict(r) for r in ledger.bench_results(profile, parse_since(since) if since else None)]
    if fmt == "csv":  # escaped as a table is (a terminal shows it); --format json keeps every byte
        click.echo(
            ledger.to_csv([{k: shown(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]),
            nl=False,
        )
    elif fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        out.print(results_table(rows))
    if plot is not None:
        from orchestrator.plot import plot as draw

        if not rows:
            raise InputError("no results to plot: run bench or sweep first, or widen --since/--profile")
        try:
            drawn = draw(sweep_mod.ranking(rows, baseline), baseline, plot)
        except OSError as exc:  # a folder this user may not write in, a full disk
            raise InputError(f"--plot {shown(plot)}: cannot be written: {exc.strerror or exc}") from None
        err.print(f"plot: {shown(plot)} ({len(drawn)} profiles)")
