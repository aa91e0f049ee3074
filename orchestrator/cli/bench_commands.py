"""`bench`, `sweep`, `results`: the tuning loop's commands, the one place their output is decided.

cli/main.py loads this module only when one of these commands runs or is listed. So deploy
need not import the bench client.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from orchestrator import ledger
from orchestrator.cli import console, params
from orchestrator.cli.console import (
    check_plot_folder,
    err,
    handle_errors,
    inventory_or_lab,
    inventory_or_running_lab,
    out,
    plain,
    shown,
)
from orchestrator.errors import InputError, Interrupted
from orchestrator.hosts.runner import TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.tuning import bench as bench_mod
from orchestrator.tuning import stats
from orchestrator.tuning import sweep as sweep_mod

inventory_option = console.inventory_option("the local lab")
limit_option = console.limit_option("Only hosts matching this pattern; the first one serves HTTP.")


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The load and traffic a bench puts on the server (shared by bench and sweep)."""
    options = [
        click.option(
            "--requests",
            "--num-prompts",
            "-n",
            "requests",
            type=params.Integer(*bench_mod.Settings.WHOLE_RANGES["requests"]),
            default=16,
            show_default=True,
            help="Requests per run (drawn from --dataset with --seed).",
        ),
        click.option(
            "--concurrency",
            "-c",
            type=params.Levels(params.Integer(1, bench_mod.Settings.WHOLE_RANGES["concurrency"][1])),
            help="Closed-loop clients (default 1); a list (1,8,32) benches each level in turn: a "
            "curve. With --request-rate: the most requests in flight (default: no cap).",
        ),
        click.option(
            "--request-rate",
            type=params.Levels(params.Decimal(*bench_mod.Settings.NUMBER_RANGES["request_rate"])),
            metavar="R[,R...]",
            help="Poisson arrivals at R requests/s instead of closed-loop clients; a list is a curve.",
        ),
        click.option(
            "--max-tokens",
            type=params.Integer(*bench_mod.Settings.WHOLE_RANGES["max_tokens"]),
            default=256,
            show_default=True,
            help="Per request; a dataset's own answer length is used when shorter.",
        ),
        click.option(
            "--warmup",
            type=params.Integer(*bench_mod.Settings.WHOLE_RANGES["warmup"]),
            default=2,
            show_default=True,
        ),
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
            type=params.Decimal(*bench_mod.Settings.NUMBER_RANGES["temperature"]),
            default=0.0,
            show_default=True,
            help="Sampling temperature (speculative acceptance falls above 0).",
        ),
        click.option(
            "--seed",
            type=params.Integer(*bench_mod.Settings.WHOLE_RANGES["seed"]),
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
    from orchestrator.tuning import datasets

    chosen = datasets.load(dataset) if dataset else None
    levels = concurrency or (1,)
    base = bench_mod.Settings(
        requests=requests,
        # with a rate and no --concurrency, nothing caps what is in flight
        concurrency=0 if request_rate and not concurrency else levels[0],
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
        from orchestrator.hosts.readback import step_of

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
    own = bench_mod.own_accept(r.row())  # this run's; the server's mixes every run since it started
    accept = f"{_num(own, 2)} (client {_num(r.accept_len_client, 2)}, log {_num(r.accept_len_log, 2)})"
    table.add_row("accept length", accept, "", "", "")
    table.add_row("accept length, server cumulative", _num(r.accept_len, 2), "", "", "")
    errors = f"{len(r.errors)} of {len(r.streams)}"
    table.add_row("errors", plain(errors, "red" if r.errors else ""), "", "", "")
    s = r.settings
    load = f"concurrency {s.concurrency}"
    if s.request_rate is not None:
        load = f"{s.request_rate:g} requests/s (Poisson), " + (
            f"at most {s.concurrency} at once" if s.concurrency else "no cap"
        )
    settings = f"{s.requests} x {s.max_tokens} tokens, {load}"
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
    from orchestrator.tuning import stats

    first = results[0]
    table = Table(title=shown(_title(first)), title_justify="left", caption=shown(traffic_line(first)))
    heads: tuple[str, ...] = ("level", "runs", "decode tok/s per request", "95% interval", "total tok/s")
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


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


#: The rows `results` shows in its table by default: a team's ledger holds 100,000.
LAST_ROWS = 200


@click.command()
@click.option("--profile", "-p", "profile_ref", metavar="NAME|PATH", help="Expected profile (checked).")
@inventory_option
@limit_option
@load_options
@click.option(
    "--repeat",
    type=params.Integer(1, 100),
    default=1,
    show_default=True,
    help="Runs per level: from 2 on, each figure gets a 95% interval.",
)
@click.option(
    "--gateway",
    "through_gateway",
    is_flag=True,
    help="Send the traffic through the hosts' gateway (orchestrator_gateway_url), e.g. a prefill/decode "
    "fleet's; the row records the fleet.",
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
    through_gateway: bool,
    as_json: bool,
) -> None:
    """Measure the deployed server: decode tok/s, TTFT, inter-token latency, accept length, errors.

    Runs against the first host of the inventory (or --limit), or with --gateway through the hosts'
    gateway, and records a ledger row per run. With a --concurrency or --request-rate list, one
    deploy is benched at each level in turn (a curve); --repeat K runs each level K times.
    """
    traffic = traffic_of(
        requests, concurrency, request_rate, max_tokens, warmup, endpoint, dataset, temperature, seed, repeat
    )
    inv = inventory_or_running_lab(inventory)
    prof = profile_mod.load(profile_ref) if profile_ref else None
    ledger.ready()  # before the runs: a measurement that cannot be recorded is not taken
    if through_gateway:
        target = bench_mod.gateway_target(inv, limit, prof)
    else:
        target = bench_mod.find_target(inv, limit, prof)
    log = bench_mod.journal_messages(inv, target.host)
    ids: list[int] = []
    failed: list[str] = []

    def on_result(result: bench_mod.BenchResult) -> None:  # recorded as it ends: Ctrl-C keeps it
        ids.append(bench_mod.record(result))

    def on_failure(settings: bench_mod.Settings, k: int, why: str, curve_id: str) -> None:
        ledger.record_bench(bench_mod.failure_row(target, settings, why, curve_id, k))
        failed.append(f"{settings.level}: {why}")

    try:
        if as_json:
            results = bench_mod.curve(target, traffic, None, log, None, on_result, on_failure)
        else:
            with _progress() as (on_progress, on_phase, _):
                name = f"bench {target.profile or '?'} on {target.host}"
                on_phase(name)

                def on_level(settings: bench_mod.Settings, k: int) -> None:
                    if len(traffic.levels()) > 1 or traffic.repeat > 1:
                        repeat = f" ({k + 1}/{traffic.repeat})" if traffic.repeat > 1 else ""
                        on_phase(f"{name} at {settings.level}{repeat}")

                results = bench_mod.curve(target, traffic, on_progress, log, on_level, on_result, on_failure)
    except KeyboardInterrupt:
        raise Interrupted(
            f"bench stopped by Ctrl-C: {len(ids)} run(s) were recorded in the ledger (`results`)"
        ) from None
    for why in failed:
        err.print(plain(f"failed: {why}", "red"))
    if as_json:
        if len(results) == 1:
            click.echo(json.dumps(results[0].to_json(ids[0]), indent=2))
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
    from orchestrator.tuning import stats

    levels = []
    for level, runs in _by_level(results):
        speeds = [r.tok_s.mean for r in runs if r.tok_s.mean is not None]
        iv = stats.interval(speeds) if speeds else None
        levels.append(
            {
                "level": level,
                "concurrency": runs[0].settings.concurrency,
                "request_rate": runs[0].settings.request_rate,
                "runs": len(runs),
                "tok_s": iv.mean if iv else None,
                "tok_s_low": iv.low if iv else None,
                "tok_s_high": iv.high if iv else None,
                "total_tok_s": _mean([r.total_tok_s for r in runs]),
                "accept_len": _mean([r.accept_len_level for r in runs]),
            }
        )
    rows = [r.to_json(i) for i, r in zip(ids, results, strict=True)]
    return {"curve_id": results[0].curve_id, "levels": levels, "runs": rows}


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
    """Where this run stands among the host's benches at its level (the same endpoint, dataset, load,
    temperature and max_tokens) in the ledger: against baseline, and the fastest."""
    host, mean = result.target.host, result.tok_s.mean
    base, best = sweep_mod.standing(host, level=sweep_mod.level_of(result.row()))
    parts = []
    if base and base.mean and mean is not None and result.target.profile != base.profile:
        parts.append(f"{mean / base.mean:.3f}x baseline ({base.mean:.1f} tok/s, {len(base.tok_s)} run(s))")
    if best and best.mean is not None:
        parts.append(f"fastest so far: {best.profile} {best.mean:.1f} tok/s ({len(best.tok_s)} run(s))")
    return f"in the ledger for {host}: " + "; ".join(parts) if parts else ""


#: What a ranking's numbers are, under every ranking table.
RANKING_CAPTION = (
    "tok/s: mean over the runs of each run's mean per-request decode tok/s, ± its 95% interval "
    f"(Student's t). vs baseline: {stats.METHOD}, at the same level only; one run cannot tell a gap "
    "from noise (--repeat 3 or more)."
)

_VERDICT_STYLE = {"faster": "green", "slower": "red", "within noise": "", "too few runs": "yellow"}


def _tok_s_text(e: sweep_mod.Entry) -> str:
    """`82.3 ± 0.9`, or `82.3` alone for one run."""
    found = e.interval
    if found is None:
        return "-"
    if found.half_width is None:
        return f"{found.mean:.1f}"
    return f"{found.mean:.1f} ± {found.half_width:.1f}"


def _verdict(e: sweep_mod.Entry, baseline: str) -> str:
    """The entry against the baseline: a stats.Verdict, `baseline` for itself, "" without one."""
    if e.ok and e.profile == baseline:
        return "baseline"
    return e.verdict or ""


def _verdict_text(e: sweep_mod.Entry, baseline: str) -> Text:
    verdict = _verdict(e, baseline)
    if e.p_value is None or verdict in ("", "baseline", "too few runs"):
        return plain(verdict or "-", _VERDICT_STYLE.get(verdict, ""))
    p = "p<0.001" if e.p_value < 0.001 else f"p={e.p_value:.3f}"
    return plain(f"{verdict} ({p})", _VERDICT_STYLE[verdict])


def ranking_table(entries: list[sweep_mod.Entry], baseline: str, title: str) -> Table:
    """Entries as ranked (sweep.ranking): per level when they hold several, the rank restarting."""
    levels = {e.level for e in entries if e.level is not None}
    several = len(levels) > 1
    one_workload = len({lv.workload for lv in levels}) == 1  # then the load alone tells them apart
    table = Table(title=title, title_justify="left", caption=RANKING_CAPTION, caption_justify="left")
    heads = ["rank", *(["level"] if several else []), "profile", "tok/s", "runs", "speed-up"]
    for col in (*heads, "vs baseline", "accept len", "note"):
        right = col in ("tok/s", "speed-up", "accept len", "runs")
        table.add_column(col, justify="right" if right else "left")
    rank, previous = 0, entries[0].level if entries else None
    for e in entries:
        if e.level != previous:
            table.add_section()
            rank, previous = 0, e.level
        named = "-" if e.level is None else e.level.load if one_workload else e.level.label()
        level = [shown(named)] if several else []
        if not e.ok:
            failed = plain(f"failed: {e.diagnosis}", "red")
            table.add_row("-", *level, shown(e.profile), "-", "0", "-", "-", "-", failed)
            continue
        rank += 1
        name = f"{e.profile} (baseline)" if e.profile == baseline else e.profile
        table.add_row(
            str(rank),
            *level,
            shown(name),
            _tok_s_text(e),
            str(len(e.tok_s)),
            f"{e.speedup:.3f}x" if e.speedup is not None else "-",
            _verdict_text(e, baseline),
            _num(e.accept_len, 2),
            plain(e.warning, "bold yellow"),
        )
    return table


def _level_json(level: sweep_mod.Level | None) -> dict[str, Any] | None:
    if level is None:
        return None
    fields = ("endpoint", "dataset", "dataset_digest", "concurrency", "request_rate", "temperature")
    return {name: getattr(level, name) for name in (*fields, "max_tokens")} | {"label": level.label()}


def _entry_json(e: sweep_mod.Entry, baseline: str) -> dict[str, Any]:
    """An entry as JSON: its runs, mean and 95% interval, speed-up and verdict against `baseline`."""
    found = e.interval
    return {
        "profile": e.profile,
        "ok": e.ok,
        "level": _level_json(e.level),
        "tok_s": e.tok_s,
        "runs": len(e.tok_s),
        "mean_tok_s": e.mean,
        "ci95_low": found.low if found else None,
        "ci95_high": found.high if found else None,
        "speedup": e.speedup,
        "verdict": _verdict(e, baseline) or None,
        "p_value": e.p_value,
        "accept_len": e.accept_len,
        "warning": e.warning,
        "diagnosis": e.diagnosis,
    }


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
    type=params.Integer(1, 100),
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
    return {
        "sweep_id": report.sweep_id,
        "baseline": report.baseline,
        "method": stats.METHOD,
        "ranking": [_entry_json(e, report.baseline) for e in report.entries],
        "left": report.left,
        "left_ok": report.left_ok,
        "left_message": report.left_message,
    }


_RELATIVE = re.compile(r"^([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*([smhdw])$")  # ASCII digits, a bounded count
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


def _requests(r: dict[str, Any]) -> str:
    """What a row sent, a line each: the endpoint, the dataset, its digest's start."""
    data = r["dataset"] or ("built-in" if not r["dataset_digest"] else "")
    return "\n".join(shown(part) for part in (r["endpoint"], data, r["dataset_digest"][:8]) if part)


def _load(r: dict[str, Any]) -> str:
    """How hard and how: `c=8`, or `4/s` for an open loop (`c<=64` its cap on requests in flight,
    when it had one); below, the temperature."""
    level = sweep_mod.level_of(r)
    cap = f"\nc<={level.concurrency}" if level.request_rate is not None and level.concurrency else ""
    return f"{level.load}{cap}\nT={level.temperature:g}"


def results_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"bench results ({shown(ledger.shown())})", title_justify="left")
    heads: tuple[str, ...] = ("time", "host", "profile", "digest", "SGLang", "requests", "load", "tok/s")
    heads += ("total tok/s", "TTFT p50 ms")
    heads += ("ITL p50 ms", "accept len", "errors", "commit", "diagnosis / notes")
    numbers = ("load", "tok/s", "total tok/s", "TTFT p50 ms", "ITL p50 ms", "accept len", "errors")
    for col in heads:  # numbers narrow, their headings over two lines: the width goes to text
        table.add_column(col, overflow="fold", max_width=7 if col in numbers else None)
    for r in rows:  # each row's columns hold what the schema says: ledger.bench_results skips others
        failed = r["result"] != "ok"
        table.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])),
            *(shown(r[column]) for column in ("host", "profile", "digest", "sglang_version")),
            _requests(r),
            _load(r),
            plain("failed", "red") if failed else _num(r["tok_s"]),
            _num(r["total_tok_s"]),
            _ms(r["ttft_p50_s"]),
            _ms(r["itl_p50_s"]),
            _num(bench_mod.own_accept(r), 2),  # the run's own, not the server's since it started
            str(r["errors"]),
            shown(r["git_commit"][:10]),
            plain(r["diagnosis"] or r["notes"], "red" if failed else "yellow"),
        )
    return table


def comparison_tables(entries: list[sweep_mod.Entry], baseline: str) -> tuple[list[Table], list[str]]:
    """Per level with a run of `baseline`, the ranking there (mean ± 95% interval, speed-up,
    verdict); and the labels of the levels without one, which nothing can be compared against."""
    by_level: dict[sweep_mod.Level, list[sweep_mod.Entry]] = {}
    for e in entries:
        if e.level is not None:
            by_level.setdefault(e.level, []).append(e)
    tables, alone = [], []
    for level, here in by_level.items():
        if any(e.ok and e.profile == baseline for e in here):
            tables.append(ranking_table(here, baseline, shown(f"against {baseline} at {level.label()}")))
        else:
            alone.append(level.label())
    return tables, alone


def _with_comparison(rows: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """JSON rows, each measured one with `comparison`: its profile's entry at its level (runs, mean,
    95% interval, speed-up and verdict against `baseline`), or null."""
    entries = [e for e in sweep_mod.ranking(rows, baseline) if e.ok]
    found = {(e.profile, e.level): e for e in entries}
    compared = {e.level for e in entries if e.profile == baseline}
    out_rows = []
    for r in rows:
        e = found.get((r["profile"], sweep_mod.level_of(r))) if sweep_mod.measured(r) else None
        if e is None:
            out_rows.append(r | {"comparison": None})
            continue
        against = {"baseline": baseline if e.level in compared else None, "method": stats.METHOD}
        out_rows.append(r | {"comparison": against | _entry_json(e, baseline)})
    return out_rows


@click.command()
@click.option("--profile", "-p", "profile", metavar="NAME", help="Only this profile.")
@click.option("--since", metavar="WHEN", help="30m, 2h, 7d, or a date/time such as 2026-11-29 14:00.")
@click.option("--endpoint", metavar="NAME", help="Only rows that benched this endpoint.")
@click.option(
    "--dataset",
    metavar="NAME|DIGEST",
    help="Only rows of this dataset: its name, its digest or the digest's first 6+ characters.",
)
@click.option(
    "--concurrency",
    "-c",
    # 0: the open-loop rows that had no cap on requests in flight
    type=params.Integer(*bench_mod.Settings.WHOLE_RANGES["concurrency"]),
    metavar="N",
    help="Only rows at this concurrency.",
)
@click.option(
    "--request-rate",
    type=params.Decimal(0, bench_mod.Settings.NUMBER_RANGES["request_rate"][1], above=True),
    metavar="R",
    help="Only open-loop rows at R requests/s.",
)
@click.option(
    "--temperature",
    type=params.Decimal(*bench_mod.Settings.NUMBER_RANGES["temperature"]),
    metavar="T",
    help="Only rows sampled at this temperature.",
)
@click.option(
    "--seed",
    type=params.Integer(*bench_mod.Settings.WHOLE_RANGES["seed"]),
    metavar="N",
    help="Only rows with this seed.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Also draw tok/s to FILE.png.")
@click.option(
    "--baseline",
    metavar="NAME",
    default="baseline",
    show_default=True,
    help="Compare each profile with this one, at each level where it ran.",
)
@click.option(
    "--last",
    "-n",
    type=params.Integer(0, 10**9),
    default=LAST_ROWS,
    show_default=True,
    help="The table shows the newest N rows (0: all). The comparison, CSV and JSON take every row.",
)
@handle_errors
def results(
    profile: str | None,
    since: str | None,
    endpoint: str | None,
    dataset: str | None,
    concurrency: int | None,
    request_rate: float | None,
    temperature: float | None,
    seed: int | None,
    fmt: str,
    plot: Path | None,
    baseline: str,
    last: int,
) -> None:
    """Bench results from the ledger, oldest first: as a table, CSV (every column) or JSON; then,
    per level (endpoint, dataset, load, temperature, max tokens), each profile against --baseline.

    The comparison: each run's mean tok/s is one sample; a profile's mean has a 95% interval over
    its runs, and Welch's t-test (p < 0.05) calls it faster, slower or within noise of the
    baseline's runs at the same level. JSON rows carry it under `comparison`.
    """
    if plot is not None and importlib.util.find_spec("matplotlib") is None:  # an extra
        raise InputError(
            "--plot draws with matplotlib, which is not installed: pip install 'orchestrator[plot]' "
            "(under pipx: pipx inject orchestrator matplotlib)"
        )
    if plot is not None:
        check_plot_folder(plot)  # before printing anything
    found = ledger.bench_results(
        profile,
        parse_since(since) if since else None,
        endpoint=endpoint,
        dataset=dataset,
        concurrency=concurrency,
        request_rate=request_rate,
        temperature=temperature,
        seed=seed,
    )
    rows = [dict(r) for r in found]
    printed = [bench_mod.printed_row(r) for r in rows]  # accept_len: the run's own figure
    if fmt == "csv":  # escaped as a table is (a terminal shows it); --format json keeps every byte
        escaped = [{k: shown(v) if isinstance(v, str) else v for k, v in r.items()} for r in printed]
        click.echo(ledger.to_csv(escaped), nl=False)
    elif fmt == "json":
        click.echo(json.dumps(_with_comparison(printed, baseline), indent=2))
    else:
        older = len(printed) - last if last else 0
        out.print(results_table(printed[older:] if older > 0 else printed))
        if older > 0:  # a team's ledger holds 100,000 rows: a terminal shows the newest
            out.print(f"{older:,} older rows not shown: --last 0 shows them, --format csv has every column")
        _print_comparison(printed, baseline)
    if plot is not None:
        _plot(printed, baseline, plot)


def _print_comparison(rows: list[dict[str, Any]], baseline: str) -> None:
    tables, alone = comparison_tables(sweep_mod.ranking(rows, baseline), baseline)
    for table in tables:
        out.print(table)
    if alone and any(r["profile"] == baseline for r in rows):
        out.print(shown(f"no {baseline} run to compare with at: {'; '.join(alone)}"))
    elif alone and rows:
        out.print(shown(f"no {baseline} runs among these rows: --baseline NAME compares with another"))


def _plot(rows: list[dict[str, Any]], baseline: str, plot: Path) -> None:
    """tok/s against load, one line per profile, where the rows hold two loads of one workload;
    else bars per profile."""
    from orchestrator.tuning import plot as plot_mod

    if not rows:
        raise InputError("no results to plot: run bench or sweep first, or widen the filters")
    curves = sweep_mod.curves(rows, baseline)
    try:
        if plot_mod.spans_loads(curves):
            lines = plot_mod.plot_curves(curves, baseline, plot)
            err.print(shown(f"plot: {plot} ({len(lines)} lines of tok/s against load)"))
        else:
            drawn = plot_mod.plot(sweep_mod.ranking(rows, baseline), baseline, plot)
            err.print(f"plot: {shown(plot)} ({len(drawn)} profiles)")
    except OSError as exc:  # a folder this user may not write in, a full disk
        raise InputError(f"--plot {shown(plot)}: cannot be written: {exc.strerror or exc}") from None
