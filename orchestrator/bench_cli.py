"""`bench`, `sweep`, `results`: the tuning loop's commands, the one place their output is decided.

Kept out of __main__.py, which loads this module only when one of these commands runs (its
LazyGroup): deploy need not import the bench client.
"""

from __future__ import annotations

import importlib.util
import json
import math
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


class _Levels(click.ParamType):
    """A comma list of numbers (`1,8,32`), each in [low, high], none twice."""

    def __init__(self, kind: type, low: float, high: float) -> None:
        self.kind, self.low, self.high = kind, low, high
        self.name = "N[,N...]" if kind is int else "R[,R...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple:
        if isinstance(value, tuple):
            return value
        levels = []
        for part in str(value).split(","):
            text = part.strip()
            try:
                number = self.kind(text)
            except ValueError:
                self.fail(f"{shown(text)!s} in {shown(value)!s} is not {self._what()}", param, ctx)
            if not (self.low <= number <= self.high) or (self.kind is float and not math.isfinite(number)):
                self.fail(f"{number:g} is not in {self.low:g}..{self.high:g}", param, ctx)
            if number in levels:
                self.fail(f"{number:g} is given twice in {shown(value)!s}", param, ctx)
            levels.append(number)
        return tuple(levels)

    def _what(self) -> str:
        return "a whole number" if self.kind is int else "a number"


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The load and traffic a bench puts on the server (shared by bench and sweep)."""
    options = [
        click.option(
            "--requests",
            "--num-prompts",
            "-n",
            "requests",
            type=click.IntRange(1, 100000),
            default=16,
            show_default=True,
            help="Requests per run (drawn from --dataset with --seed).",
        ),
        click.option(
            "--concurrency",
            "-c",
            type=_Levels(int, 1, 1024),
            help="Closed-loop clients (default 1); a list (1,8,32) benches each level in turn: a "
            "curve. With --request-rate: the most requests in flight (default: no cap).",
        ),
        click.option(
            "--request-rate",
            type=_Levels(float, 0.001, 100000),
            metavar="R[,R...]",
            help="Poisson arrivals at R requests/s instead of closed-loop clients; a list is a curve.",
        ),
        click.option(
            "--max-tokens",
            type=click.IntRange(2, 1_000_000),
            default=256,
            show_default=True,
            help="Per request; a dataset's own answer length is used when shorter.",
        ),
        click.option("--warmup", type=click.IntRange(0, 1000), default=2, show_default=True),
        click.option(
            "--endpoint",
            type=click.Choice(list(bench_mod.ENDPOINTS)),
            default="generate",
            show_default=True,
            help="generate: /generate with raw text; chat: /v1/chat/completions with messages "
            "(the model's chat template applies); completions: /v1/completions.",
        ),
        click.option(
            "--dataset",
            "--prompts",
            "dataset",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help='ShareGPT JSON, OpenAI-style JSONL ({"messages": [...]}), bench_serving\'s custom '
            "JSONL, or one prompt per line. Default: six built-in prompts.",
        ),
        click.option(
            "--temperature",
            type=click.FloatRange(0, 2),
            default=0.0,
            show_default=True,
            help="Sampling temperature (speculative acceptance falls above 0).",
        ),
        click.option(
            "--seed",
            type=click.IntRange(0, 2**31 - 1),
            default=0,
            show_default=True,
            help="Which prompts --dataset gives, and the Poisson arrival times.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def traffic_of(
    requests: int,
    concurrency: tuple[int, ...] | None,
    request_rate: tuple[float, ...] | None,
    max_tokens: int,
    warmup: int,
    endpoint: str,
    dataset: Path | None,
    temperature: float,
    seed: int,
    repeat: int = 1,
) -> bench_mod.Traffic:
    """The options of load_options as a Traffic (the dataset read and checked here, before
    any host is touched)."""
    if request_rate and concurrency and len(concurrency) > 1:
        raise click.UsageError(
            "--request-rate with a --concurrency list: give a curve of one or the other "
            "(--concurrency N with --request-rate caps the requests in flight)"
        )
    from orchestrator import datasets

    chosen = datasets.load(dataset) if dataset else None
    levels = concurrency or (1,)
    base = bench_mod.Settings(
        requests=requests,
        # with a rate and no --concurrency, nothing caps what is in flight
        concurrency=requests if request_rate and not concurrency else levels[0],
        max_tokens=max_tokens,
        warmup=warmup,
        endpoint=endpoint,
        dataset=chosen,
        temperature=temperature,
        seed=seed,
    )
    return bench_mod.Traffic(base, levels, tuple(request_rate or ()), repeat)


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


def _title(r: bench_mod.BenchResult) -> str:
    t = r.target
    return (
        f"bench {t.profile or '?'} on {t.host} ({t.url}, digest {t.digest or '?'}, SGLang {r.sglang_version})"
    )


def bench_table(r: bench_mod.BenchResult) -> Table:
    table = Table(title=shown(_title(r)), title_justify="left")  # the host's own words, most of it
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


def traffic_line(r: bench_mod.BenchResult) -> str:
    """What the requests were: endpoint, dataset, sampling."""
    s, source = r.settings, r.settings.source
    data = f"{source.name} ({source.fmt}, {source.digest})" if source.digest else "built-in prompts"
    seed = f", seed {s.seed}" if s.dataset is not None or s.request_rate is not None else ""
    return f"{s.endpoint} ({bench_mod.ENDPOINTS[s.endpoint]}), {data}, temperature {s.temperature:g}{seed}"


def curve_table(results: list[bench_mod.BenchResult]) -> Table:
    """One row per level: the mean of its repeats, with a 95% interval from two repeats on."""
    from orchestrator import stats

    first = results[0]
    table = Table(title=shown(_title(first)), title_justify="left", caption=shown(traffic_line(first)))
    heads = ("level", "runs", "decode tok/s per request", "95% interval", "total tok/s")
    heads += ("TTFT p50 ms", "ITL p50 ms", "accept len", "errors")
    for col in heads:
        table.add_column(col, justify="left" if col == "level" else "right")
    for level, runs in _by_level(results):
        speeds = [r.tok_s.mean for r in runs if r.tok_s.mean is not None]
        iv = stats.interval(speeds) if speeds else None
        span = f"{iv.low:.1f}..{iv.high:.1f}" if iv and iv.low is not None and iv.high is not None else "-"
        accept = [r.accept_len_level for r in runs if r.accept_len_level is not None]
        errors = sum(len(r.errors) for r in runs)
        table.add_row(
            level,
            str(len(runs)),
            _num(iv.mean if iv else None),
            span,
            _num(_mean([r.total_tok_s for r in runs])),
            _ms(_mean([r.ttft.p50 for r in runs])),
            _ms(_mean([r.itl.p50 for r in runs])),
            _num(_mean(accept), 2),
            plain(f"{errors} of {sum(len(r.streams) for r in runs)}", "red" if errors else ""),
        )
    return table


def _by_level(results: list[bench_mod.BenchResult]) -> list[tuple[str, list[bench_mod.BenchResult]]]:
    levels: dict[str, list[bench_mod.BenchResult]] = {}
    for r in results:
        levels.setdefault(r.settings.level, []).append(r)
    return list(levels.items())


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


@click.command()
@click.option("--profile", "-p", "profile_ref", metavar="NAME|PATH", help="Expected profile (checked).")
@inventory_option
@limit_option
@load_options
@click.option(
    "--repeat",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Runs per level: from 2 on, each figure gets a 95% interval.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the result as JSON: one run's ledger row, or {curve_id, runs, levels} for several.",
)
@handle_errors
def bench(
    profile_ref: str | None,
    inventory: Path | None,
    limit: str | None,
    requests: int,
    concurrency: tuple[int, ...] | None,
    request_rate: tuple[float, ...] | None,
    max_tokens: int,
    warmup: int,
    endpoint: str,
    dataset: Path | None,
    temperature: float,
    seed: int,
    repeat: int,
    as_json: bool,
) -> None:
    """Measure the deployed server: decode tok/s, TTFT, inter-token latency, accept length, errors.

    Runs against the first host of the inventory (or --limit) and records a ledger row per
    run. With a --concurrency or --request-rate list, one deploy is benched at each level in
    turn (a curve); --repeat K runs each level K times.
    """
    traffic = traffic_of(
        requests, concurrency, request_rate, max_tokens, warmup, endpoint, dataset, temperature, seed, repeat
    )
    inv = inventory_or_running_lab(inventory)
    prof = profile_mod.load(profile_ref) if profile_ref else None
    target = bench_mod.find_target(inv, limit, prof)
    log = bench_mod.journal_messages(inv, target.host)
    if as_json:
        results = bench_mod.curve(target, traffic, None, log)
    else:
        with _progress() as (on_progress, on_phase, _):
            name = f"bench {target.profile or '?'} on {target.host}"
            on_phase(name)

            def on_level(settings: bench_mod.Settings, k: int) -> None:
                if len(traffic.levels()) > 1 or traffic.repeat > 1:
                    on_phase(
                        f"{name} at {settings.level}"
                        + (f" ({k + 1}/{traffic.repeat})" if traffic.repeat > 1 else "")
                    )

            results = bench_mod.curve(target, traffic, on_progress, log, on_level)
    ids = [bench_mod.record(r) for r in results]
    if as_json:
        if len(results) == 1:
            click.echo(json.dumps({"ledger_id": ids[0], **results[0].row()}, indent=2))
        else:
            click.echo(json.dumps(_curve_json(results, ids), indent=2))
        return
    if len(results) == 1:
        out.print(bench_table(results[0]))
        out.print(shown(traffic_line(results[0])))
    else:
        out.print(curve_table(results))
    for line in standing_lines(results):
        out.print(shown(line))
    for note in dict.fromkeys(note for r in results for note in r.notes):
        err.print(plain(f"note: {note}", "yellow"))
    if traffic.base.dataset is not None and traffic.base.dataset.skipped:
        err.print(plain(f"note: {traffic.base.dataset.name}: {traffic.base.dataset.skipped_why}", "yellow"))


def _curve_json(results: list[bench_mod.BenchResult], ids: list[int]) -> dict[str, Any]:
    from orchestrator import stats

    levels = []
    for level, runs in _by_level(results):
        iv = stats.interval([r.tok_s.mean for r in runs if r.tok_s.mean is not None])
        levels.append(
            {
                "level": level,
                "concurrency": runs[0].settings.concurrency,
                "request_rate": runs[0].settings.request_rate,
                "runs": len(runs),
                "tok_s": iv.mean,
                "tok_s_low": iv.low,
                "tok_s_high": iv.high,
                "total_tok_s": _mean([r.total_tok_s for r in runs]),
                "accept_len": _mean([r.accept_len_level for r in runs]),
            }
        )
    runs = [{"ledger_id": i, **r.row()} for i, r in zip(ids, results, strict=True)]
    return {"curve_id": results[0].curve_id, "levels": levels, "runs": runs}


def standing_lines(results: list[bench_mod.BenchResult]) -> list[str]:
    """standing_line for each level (the newest run of it), the level named on a curve."""
    levels = _by_level(results)
    lines = []
    for level, runs in levels:
        line = standing_line(runs[-1])
        if line:
            lines.append(f"{level}: {line}" if len(levels) > 1 else line)
    return lines


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
    "--repeat",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Benches per profile and level: from 2 on, intervals and faster/slower/within-noise verdicts.",
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
    concurrency: tuple[int, ...] | None,
    request_rate: tuple[float, ...] | None,
    max_tokens: int,
    warmup: int,
    endpoint: str,
    dataset: Path | None,
    temperature: float,
    seed: int,
    as_json: bool,
) -> None:
    """Deploy, bench and record each profile; rank them; leave the fastest (or --leave) deployed.

    With a --concurrency or --request-rate list every profile is benched at each level after
    its one deploy, and ranked at each level.
    """
    profiles = (*profiles, *more_profiles)
    if not profiles:
        raise click.UsageError(
            "name the profiles to sweep: `sweep baseline cg_5tok` or `sweep -p baseline -p cg_5tok`"
        )
    traffic = traffic_of(
        requests, concurrency, request_rate, max_tokens, warmup, endpoint, dataset, temperature, seed, repeat
    )
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
            leave=leave,
            traffic=traffic,
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
