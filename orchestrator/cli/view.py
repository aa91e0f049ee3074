"""Rich output: the live per-host view while a play runs, and the tables after it.

Host names, steps, messages, journal lines and process names are the inventory's and the hosts'
words. Each goes through console.shown (or plain). So none is read as markup, and none can drive the
terminal.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.cli.console import err, out, plain, shown
from orchestrator.hosts import startup_watch
from orchestrator.hosts.host_report import DeployReport
from orchestrator.hosts.module_results import HEALTH, HealthResult, ResultError
from orchestrator.hosts.preflight_play import PreflightResult
from orchestrator.hosts.readback import step_of, typed
from orchestrator.hosts.runner import TaskEvent
from orchestrator.render.launch import flag_changes

if TYPE_CHECKING:
    from types import TracebackType

    from orchestrator.hosts.status_play import HostStatus


class LiveHosts:
    """A table of each host's current step and elapsed time, refreshed while Ansible runs."""

    def __init__(self, console: Console, title: str):
        self.console = console
        self.title = title
        self.rows: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.live = Live(console=console, refresh_per_second=4, transient=True, get_renderable=self._render)

    def __enter__(self) -> LiveHosts:
        self.live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.__exit__(exc_type, exc, tb)

    def event(self, ev: TaskEvent) -> None:
        with self.lock:
            row = self.rows.setdefault(ev.host, {"start": ev.at, "step": "", "state": "running", "end": None})
            if ev.kind == "start" and step_of(ev):
                row["step"] = step_of(ev)
            elif ev.kind in ("failed", "unreachable"):
                row["state"], row["end"] = ev.kind, ev.at
            elif ev.kind == "interrupted":
                row["state"], row["end"] = f"interrupted: {ev.result.get('msg', '')}", None
            elif ev.action == HEALTH and ev.kind in ("ok", "changed"):
                row["state"], row["end"] = "healthy", ev.at
            elif ev.action == HEALTH and ev.kind == "progress":
                row["state"] = progress_line(ev) or row["state"]

    def _render(self) -> Table:
        table = Table(title=shown(self.title), title_justify="left")
        for col in ("host", "step", "state", "elapsed"):
            table.add_column(col)
        now = time.monotonic()
        with self.lock:
            for host, row in sorted(self.rows.items()):
                elapsed = (row["end"] or now) - row["start"]
                style = {"failed": "red", "unreachable": "red", "healthy": "green"}.get(row["state"], "")
                table.add_row(
                    shown(host), shown(row["step"]), plain(row["state"], style), f"{elapsed:5.1f} s"
                )
        return table


def start_event(ev: TaskEvent) -> dict[str, Any] | None:
    """A health wait's report of a start under way as JSON (deploy --json's stderr lines); None
    for any other event or a report that cannot be read."""
    if ev.action != HEALTH or ev.kind != "progress":
        return None
    try:
        r = typed(ev)
    except ResultError:
        return None
    if not isinstance(r, HealthResult):
        return None
    return {
        "event": "startup",
        "host": ev.host,
        "phase": r.phase,
        "progress": r.progress.model_dump() if r.progress else None,
        "phase_s": r.phase_s,
        "elapsed_s": r.elapsed_s,
        "eta_s": r.eta_s,
        "phases": [p.model_dump() for p in r.phases],
    }


def progress_line(ev: TaskEvent) -> str:
    """`CUDA graphs 23/36 (bs 96), 1m12s, ~40 s left` for a start under way; "" otherwise."""
    data = start_event(ev)
    if data is None:
        return ""
    r = typed(ev)
    assert isinstance(r, HealthResult)
    return startup_watch.live(r.phase, r.progress, r.phase_s, r.eta_s)


def startup_lines(report: DeployReport) -> Group:
    """`lab1: healthy after 6m12s: weights 4m10s, CUDA graphs 1m40s, warm-up 22s`, per started host;
    below it what was read into the page cache before the stop, and the memory the server logged
    against the prediction."""
    lines = []
    for h in report.hosts:
        said = (takeover_text(h.takeover), relaunch_text(h.relaunched))
        for what in (*said, h.startup, read_ahead_text(h.read_ahead), memory_text(h.memory)):
            if what:
                lines.append(Text.assemble(shown(h.host), ": ", plain(what)))
    return Group(*lines)


def takeover_text(t: dict[str, Any]) -> str:
    """`took over PID 4242 (nohup), started by hand; its log was /data/x.log` (or why not)."""
    if not t:
        return ""
    if not t.get("taken"):
        return f"nothing to take over: {t.get('why') or 'the hand-started server had ended'}"
    launcher = t.get("launcher") or {}
    how = f" ({launcher.get('kind')})" if launcher.get("kind") else ""
    log = f"; its log was {t['log']}" if t.get("log") else ""
    return f"took over PID {t.get('pid')}{how}, started by hand, stopped first{log}"


def relaunch_text(r: dict[str, Any]) -> str:
    """Where the unit failed after a take-over: the hand command started again, or why not."""
    if not r:
        return ""
    if r.get("healthy"):
        log = f", writing {r['log']}" if r.get("log") else ""
        return f"the unit failed: the hand command runs again as it ran, PID {r.get('pid')}{log}"
    return f"the unit failed, and the hand command did not start again: {r.get('error') or 'no health'}"


def read_ahead_text(r: dict[str, Any]) -> str:
    """`page cache: read 8.0 GiB ahead in 3.1 s, before the stop` (or why nothing was read)."""
    if not r:
        return ""
    total = _gib(int(r.get("total_bytes") or 0) / 2**20)
    if r.get("stopped") == "memory":
        free = _gib(max(0, int(r.get("available_bytes") or 0)) / 2**20)
        return f"page cache: not read ahead: the model's {total} do not fit in the {free} free"
    if r.get("stopped") == "unknown":
        return "page cache: not read ahead: this kernel does not say which pages are cached (mincore)"
    read = _gib(int(r.get("read_bytes") or 0) / 2**20)
    stopped = f" (stopped: {r['stopped']})" if r.get("stopped") else ""
    seconds = float(r.get("seconds") or 0)
    return f"page cache: read {read} of {total} ahead in {seconds:.1f} s, before the stop{stopped}"


def memory_text(memory: dict[str, Any]) -> str:
    """`memory per GPU: weights 71.7 GiB (predicted 71.7 GiB), KV cache 587,687 tokens (predicted ...)`."""
    measured, predicted = memory.get("measured") or {}, memory.get("predicted") or {}
    parts = []
    for key, name, show in (("weights_mib", "weights", _gib), ("kv_tokens", "KV cache tokens", _tokens)):
        if measured.get(key) is None:
            continue
        said = f"{name} {show(measured[key])}"
        if predicted.get(key) is not None:
            said += f" (predicted {show(predicted[key])})"
        parts.append(said)
    return "memory per GPU: " + ", ".join(parts) if parts else ""


def _gib(mib: Any) -> str:
    return f"{float(mib) / 1024:.1f} GiB" if isinstance(mib, int | float) else "-"


def _tokens(count: Any) -> str:
    return f"{int(count):,}" if isinstance(count, int | float) else "-"


def memory_table(results: list[PreflightResult]) -> Table | None:
    """Per host, the GPU memory of the planned start as predicted from the safetensors headers,
    and what the server logged on its last start of the same files and layout: per GPU, the
    static pool, the weights (target and drafter), the KV cache in tokens and the CUDA graphs."""
    fits = [(r.host, r.memory) for r in results if r.memory]
    if not fits:
        return None
    table = Table(title="GPU memory per GPU (predicted / last measured)", title_justify="left")
    for col in ("host", "GPU", "TP", "static pool", "weights", "drafter", "KV tokens", "needs", "graphs"):
        table.add_column(col, overflow="fold")
    for host, m in fits:
        last = m.get("last_measured") or {}
        gpu, settings = m.get("gpu") or {}, m.get("settings") or {}

        def pair(key: str, show: Any, m: dict[str, Any] = m, last: dict[str, Any] = last) -> str:
            mine = show(m.get(key))
            return f"{mine} / {show(last[key])}" if last.get(key) is not None else mine

        fraction = m.get("mem_fraction_static")
        pool = f"{fraction:.3f} x = {_gib(m.get('static_mib'))}" if isinstance(fraction, float) else "-"
        table.add_row(
            shown(host),
            shown(f"{gpu.get('name', '')} {_gib(gpu.get('total_mib'))}"),
            str(settings.get("tp_size", "-")),
            shown(pool),
            pair("weights_mib", _gib),
            pair("draft_weights_mib", _gib),
            pair("kv_tokens", _tokens),
            _tokens(m.get("needs_tokens")),
            pair("graph_mib", _gib),
        )
    table.caption = "a / b: predicted / last measured (the server's own log lines of its last start)"
    return table


def deploy_table(report: DeployReport) -> Table:
    title = f"{'check' if report.check else 'deploy'} {report.profile} (digest {report.digest})"
    if report.rollback:  # each host goes to its own recorded unit
        title = report.profile
    elif not report.digest:
        title = f"{'check' if report.check else 'deploy'} {report.profile} (a unit per rank: digest per host)"
    table = Table(title=shown(title), title_justify="left")
    for col in ("host", "result", "changed", "restarted", "healthy after", "unit digest", "last step"):
        table.add_column(col)
    rolled = any(h.rolled_back_to or h.rollback_error for h in report.hosts)
    if rolled:
        table.add_column("rollback")
    for h in report.hosts:
        if report.check and not h.ok:
            result = Text("would fail", style="bold red")
        elif report.check:
            result = Text(
                "would restart" if h.reasons else "no change", style="yellow" if h.reasons else "green"
            )
        else:
            result = Text("healthy" if h.ok else "FAILED", style="green" if h.ok else "bold red")
        row: list[str | Text] = [
            shown(h.host),
            result,
            "yes" if h.changed else "no",
            "yes" if h.restarted else "no",
            f"{h.healthy_after_s:.1f} s" if h.healthy_after_s is not None else "-",
            shown(h.digest or "-"),
            shown(h.step),
        ]
        if rolled:
            row.append(
                plain(f"to {h.rolled_back_to}") if h.rolled_back_to else plain(h.rollback_error, "red")
            )
        table.add_row(*row)
    return table


def failures(report: DeployReport) -> Group:
    """For each failed host: the step, Ansible's message, and the journal's last lines."""
    parts: list[Any] = []
    for h in report.hosts:
        if h.ok:
            continue
        what = h.diagnosis or f"failed at {h.step}: {h.message}"
        parts.append(plain(f"{h.host}: {what}", "bold red"))
        if h.diagnosis and h.message and h.step != "health":
            pass  # the diagnosis already quotes Ansible's message
        elif h.message and h.step == "health":
            parts.append(plain(f"  {h.message}", "red"))
        for line in h.journal:
            parts.append(plain(f"  | {line}", "dim", keep="\t"))
        for k in h.killed:
            parts.append(
                plain(
                    f"  killed PID {k['pid']} {k['process_name']} ({_mib(k['used_mib'])} on GPU {k['gpu']})"
                )
            )
        if h.rolled_back_to:
            parts.append(plain(f"  rolled back to {h.rolled_back_to}", "yellow"))
        elif h.rollback_error:
            parts.append(plain(f"  not rolled back: {h.rollback_error}", "red"))
    return Group(*parts)


def check_details(report: DeployReport) -> Group:
    """Per host: would it restart and why, the flag-level summary, the unit diff, the GPU state."""
    parts: list[Any] = []
    for h in report.hosts:
        parts.append(plain(f"── {h.host}", "bold"))
        if not h.ok:
            parts.append(plain(f"  check failed at {h.step}: {h.message}", "red"))
            continue
        restart = f"restart: yes ({'; '.join(h.reasons)})" if h.reasons else "restart: no"
        parts.append(plain(f"  {restart}"))
        planned = h.planned_unit
        changes = flag_changes(h.previous_unit, planned) if h.previous_unit != planned else []
        for line in changes:
            parts.append(plain(f"  {line}", "cyan"))
        if h.diff:
            for line in h.diff.splitlines():
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
                parts.append(plain(f"  {line}", style, keep="\t"))
        parts.append(plain(f"  GPUs: {_gpu_state(h.gpus)}"))
        out = h.gateway.get("out")
        if out:
            verb = (
                "would take it out of the gateway's rotation and drain it"
                if out.get("changed")
                else ("the gateway does not list it: nothing to drain")
            )
            parts.append(Text(f"  gateway: {verb}"))
    return Group(*parts)


def gateway_steps(report: DeployReport) -> Group:
    """Per drained host, one line: what the gateway and the server said at each step."""
    parts: list[Any] = []
    for h in report.hosts:
        g = h.gateway
        if not g or report.check:
            continue
        said = []
        if "out" in g:
            before = g["out"].get("before") or {}
            state = (
                "healthy" if before.get("is_healthy") else "listed" if before.get("listed") else "not listed"
            )
            said.append(f"out of rotation (was {state})" if g["out"].get("changed") else "already out")
        if "drain" in g:
            d = g["drain"]
            left = f", {d['in_flight']} still in flight at the timeout" if d.get("timed_out") else ""
            said.append(f"drained in {d.get('waited_s')} s{left}")
        if "prove" in g:
            said.append(f"/health_generate {g['prove'].get('status')}")
        if "back" in g:
            after = g["back"].get("after") or {}
            said.append("back in rotation, healthy" if after.get("is_healthy") else "back, NOT healthy")
        style = "yellow" if "left_out" in g else "dim"
        if "left_out" in g:
            said.append(f"LEFT OUT of rotation: {g['left_out']}")
        parts.append(plain(f"{h.host}: gateway: " + " -> ".join(said), style))
    return Group(*parts)


def _gpu_state(gpus: dict[str, Any]) -> str:
    if not gpus:
        return "not checked (no restart needed)"
    if gpus.get("idle"):
        return "idle"
    by_holder: dict[str, list[int]] = {}
    for b in gpus.get("busy", []):
        who = ", ".join(f"PID {x['pid']} {x['process_name']} {_mib(x['used_mib'])}" for x in b["holders"])
        by_holder.setdefault(who or "no process listed", []).append(b["index"])
    held = "; ".join(f"GPU {','.join(map(str, idx))}: {who}" for who, idx in by_holder.items())
    return f"busy ({held}); a deploy stops our server, then requires them idle"


def gpu_ranges(indexes: list[int]) -> str:
    """GPU indexes as runs: [0, 1, 2, 3, 5] -> "0-3,5"."""
    runs: list[list[int]] = []
    for i in sorted(set(indexes)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def holders_line(holders: list[dict[str, Any]], unit: str = "") -> str:
    """One entry per process, not per GPU: "1072 /usr/bin/python3 on GPU 0-7, 1012144 MiB"; a
    process of an orchestrator unit other than `unit` says which ("..., 4000 MiB (sglang-b.service)")."""
    by_pid: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for h in holders:
        by_pid.setdefault((h["pid"], h["process_name"]), []).append(h)
    return "; ".join(
        f"{pid} {name} on GPU {gpu_ranges([h['gpu'] for h in hs])}, {_memory(hs)}{_other_unit(hs, unit)}"
        for (pid, name), hs in by_pid.items()
    )


def _other_unit(holders: list[dict[str, Any]], unit: str) -> str:
    other = holders[0].get("unit") or ""
    return f" ({other})" if other and other != unit else ""


_HEALTH = {
    200: Text("200 ok", style="green"),
    503: Text("503 starting", style="yellow"),
    -1: Text("no answer", style="red"),
    None: Text("-"),
}


def status_table(rows: list[HostStatus], unit_name: str = "") -> Table:
    """One row per unit of each host (a host without one: a row saying so). GPU memory and
    holders are those of the unit's own GPUs."""
    table = Table(title=f"status of {shown(unit_name)}" if unit_name else "status", title_justify="left")
    pd = any(r.pd for r in rows)  # a PD fleet: each server's role and bootstrap port
    columns = ("host", "unit", "profile", *(("role",) if pd else ()), "digest", "port", "GPUs", "state")
    for col in (*columns, "MainPID", "uptime", "health", "accept len", "GPU MiB used", "holders"):
        # What a glance must read whole; the digest and the holders wrap first.
        table.add_column(col, no_wrap=col in ("host", "unit", "profile", "role", "state", "accept len"))
    for r in rows:
        gpus = gpu_ranges(r.gpus) if r.gpus else ("all" if r.unit else "-")
        accept = accept_cell(r.speculative, r.accept_len) if r.active_state == "active" else "-"
        table.add_row(  # what the host's state files and systemd say: shown, never trusted as text
            shown(r.host) if r.reachable else plain(f"{r.host} (unreachable)", "red"),
            shown(r.unit or "-"),
            shown(r.profile or "-"),
            *((pd_cell(r.pd),) if pd else ()),
            shown(r.digest or "-"),
            shown(r.port if r.port is not None else "-"),
            gpus,
            shown(r.active_state),
            shown(r.main_pid or "-"),
            f"{r.uptime_s:.0f} s" if r.uptime_s is not None else "-",
            _HEALTH.get(r.health, shown(r.health)),
            accept,
            shown(r.gpu_used_mib),
            shown(holders_line(r.gpu_holders, r.unit) or "-"),
        )
    return table


def pd_cell(pd: dict[str, Any]) -> str:
    """A PD server's role, with the bootstrap port its prefill peer serves KV on."""
    if not pd:
        return "-"
    return shown(f"{pd.get('role', '?')} (bootstrap {pd.get('bootstrap_port', '?')})")


def _mib(used: int | None) -> str:
    return "? MiB" if used is None else f"{used} MiB"


def _memory(holders: list[dict[str, Any]]) -> str:
    """The process's memory over its GPUs; nvidia-smi's `[N/A]` (None) is `?`, never counted as 0."""
    known = [h["used_mib"] for h in holders if h["used_mib"] is not None]
    unknown = [h["gpu"] for h in holders if h["used_mib"] is None]
    if not unknown:
        return f"{sum(known)} MiB"
    if not known:
        return "? MiB"
    return f"{sum(known)} MiB + ? MiB on GPU {gpu_ranges(unknown)}"


def accept_cell(speculative: bool, accept_len: float | None) -> Text:
    """The accept length a server logs: red, with the reason, when speculation gains nothing."""
    from orchestrator.tuning.bench import DRAFTER_FLOOR

    if not speculative:
        return Text("- (no speculation)", style="dim")
    if accept_len is None:
        return Text("- (no decode yet)", style="dim")
    if accept_len <= DRAFTER_FLOOR:
        return Text(f"{accept_len:.2f} drafter not helping", style="bold red")
    return Text(f"{accept_len:.2f}")


def _json_progress(ev: Any) -> None:
    """deploy --json: each start-up report as one JSON line on stderr (stdout keeps the one result)."""
    data = start_event(ev)
    if data is not None:
        click.echo(json.dumps(data), err=True)


def show_deploy(run: Callable[..., Any], title: str, as_json: bool, check: bool = False) -> None:
    """Run a deploy-shaped action with the live view (quietly for --json), print the outcome, exit."""
    if as_json:
        report = run(_json_progress)
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        with LiveHosts(err, shown(title)) as live:
            report = run(live.event)
        if check:
            out.print(check_details(report))
        out.print(deploy_table(report))
        out.print(startup_lines(report))
        out.print(gateway_steps(report))
        out.print(failures(report))
    if report.interrupted:
        sys.exit(130)  # as a shell reports a command ended by Ctrl-C
    sys.exit(0 if report.ok else 1)
