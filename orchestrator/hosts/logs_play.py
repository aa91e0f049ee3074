"""The unit's journal from each host, merged in time order: read by playbooks/logs.yml, parsed here.

Engine layer: never prints. `read()` returns one `LogBatch`. `follow()` yields one per play. Each
host continues after the journal cursor of the last entry it gave.
"""

from __future__ import annotations

import heapq
import json
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.hosts.inventory import no_match
from orchestrator.hosts.playvars import LogsRequest, PlayVars
from orchestrator.hosts.runner import HostRun, run_playbook

#: The playbook's one action; its module result holds journalctl's stdout.
ACTION = "ansible.builtin.command"
#: SGLang's decode log lines carry the speculative accept length of the last batches.
ACCEPT_LINE = re.compile(r"accept len: ([0-9]+(?:\.[0-9]+)?)")
#: Most entries one host sends per --follow round: enough to catch up with a chatty server
#: within a few rounds, small enough that one play's output stays modest.
FOLLOW_BATCH = 1000
#: journalctl -o json writes null for a field above its size threshold (64 KiB).
TOO_LARGE = "<message too large for journalctl -o json: not shown>"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class LogLine:
    """One journal entry of one host; `time` is aware (UTC) so hosts in any time zone merge right."""

    host: str
    time: datetime
    pid: int | None
    message: str


@dataclass(frozen=True)
class HostFailure:
    """A host whose journal could not be read this round; the others are still shown."""

    host: str
    message: str
    unreachable: bool


@dataclass
class LogBatch:
    """One play's harvest: merged lines, where each host got to, and who failed."""

    hosts: list[str]
    lines: list[LogLine]
    cursors: dict[str, str] = field(default_factory=dict)
    failures: list[HostFailure] = field(default_factory=list)


def message_text(value: Any) -> str:
    """MESSAGE as text: journalctl gives non-UTF-8 messages as a list of byte values."""
    if value is None:
        return TOO_LARGE
    if isinstance(value, list):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def parse_entry(host: str, entry: dict[str, Any]) -> LogLine:
    """One `journalctl -o json` object as a LogLine (microseconds kept exactly, no float)."""
    micros = int(entry["__REALTIME_TIMESTAMP"])
    pid = entry.get("_PID")
    return LogLine(
        host=host,
        time=_EPOCH + timedelta(microseconds=micros),
        pid=int(pid) if isinstance(pid, str) and pid.isdigit() else None,
        message=message_text(entry.get("MESSAGE", "")),
    )


def parse_journal(host: str, stdout: str, *, newest_first: bool) -> tuple[list[LogLine], str]:
    """Lines oldest first, and the cursor of the newest ("" when there were none)."""
    entries = [json.loads(raw) for raw in stdout.splitlines() if raw.strip()]
    if newest_first:
        entries.reverse()
    cursor = entries[-1].get("__CURSOR", "") if entries else ""
    return [parse_entry(host, e) for e in entries], cursor


def merge(per_host: Iterable[Sequence[LogLine]]) -> list[LogLine]:
    """Interleave hosts by time; each host keeps its journal order even if its clock stepped back."""
    return list(heapq.merge(*per_host, key=lambda line: line.time))


def accept_from_log(messages: Sequence[str]) -> float | None:
    """Mean of the `accept len: X` values of SGLang's decode log lines; None when there are none."""
    values = [float(m.group(1)) for m in map(ACCEPT_LINE.search, messages) if m]
    return statistics.fmean(values) if values else None


def request(
    unit_name: str, lines: int, since: str | None, cursors: dict[str, str], grep: str | None = None
) -> PlayVars:
    """The journalctl argv lists the playbook picks from per host.

    A first read uses --reverse: with --since, journalctl's -n alone keeps the *oldest* N.
    It asks for at least one entry, which `read` does not print when `lines` is 0: its cursor
    is where --follow starts, so `-f -n 0` shows only what comes after, as `tail -f -n 0` does.
    A read after a cursor goes forward, so nothing between two rounds is skipped.
    """
    # Only the fields we print (the cursor and timestamps always come along): a journal entry
    # is ~30 fields, and ansible-runner drops a task result over MAX_EVENT_RES (700 kB) whole.
    base = ["journalctl", "-u", unit_name, "-o", "json", "--output-fields=MESSAGE,_PID", "--no-pager"]
    window = ["--since", since] if since else []
    if grep:  # only the entries that match, so a long window stays a small answer
        window += ["--grep", grep]
    logs = LogsRequest(
        first_argv=[*base, "--reverse", "-n", str(max(lines, 1)), *window],
        next_argv=[*base, "-n", str(FOLLOW_BATCH), *window],
        cursors=cursors,
    )
    return PlayVars(logs=logs)


def _host_batch(run: HostRun, newest_first: bool) -> tuple[list[LogLine], str | None, HostFailure | None]:
    """A host's lines and new cursor, or why there are none (the cursor is None then)."""
    failed = run.failed
    if failed is not None:
        res = failed.result
        why = (res.get("stderr") or res.get("msg") or "failed").strip()
        return [], None, HostFailure(run.host, why, failed.kind == "unreachable")
    result = run.result_of(ACTION)
    if result is None:
        return [], None, HostFailure(run.host, "the journal task did not run", False)
    if "stdout" not in result:
        why = "journal output larger than ansible-runner passes on (MAX_EVENT_RES); ask for fewer --lines"
        return [], None, HostFailure(run.host, why, False)
    try:
        lines, cursor = parse_journal(run.host, result.get("stdout", ""), newest_first=newest_first)
    except (ValueError, KeyError, TypeError) as exc:
        return [], None, HostFailure(run.host, f"unreadable journalctl output: {exc}", False)
    return lines, cursor, None


def read(
    inventory: Path,
    *,
    unit_name: str = "sglang.service",
    lines: int = 40,
    since: str | None = None,
    limit: str | None = None,
    cursors: dict[str, str] | None = None,
    grep: str | None = None,
) -> LogBatch:
    """One play: each host's last `lines` entries, or (hosts in `cursors`) the entries after them;
    with `grep`, only those matching it (journalctl --grep)."""
    known = dict(cursors or {})
    play = run_playbook("logs.yml", inventory, request(unit_name, lines, since, known, grep), limit=limit)
    if not play.hosts:
        raise no_match(inventory, limit)
    batch = LogBatch(hosts=sorted(play.hosts), lines=[], cursors=known)
    per_host = []
    for host in batch.hosts:
        first = host not in known
        host_lines, cursor, failure = _host_batch(play.hosts[host], newest_first=first)
        if first and not lines:
            host_lines = []  # the one entry read for its cursor
        if failure:
            batch.failures.append(failure)
        per_host.append(host_lines)
        # Keep a host's old cursor when it had nothing new; a first read records even "".
        if cursor is not None and (cursor or host not in known):
            batch.cursors[host] = cursor
    batch.lines = merge(per_host)
    return batch


def follow(
    inventory: Path,
    *,
    unit_name: str = "sglang.service",
    lines: int = 40,
    since: str | None = None,
    limit: str | None = None,
    interval_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[LogBatch]:
    """Endless batches, a play at most every `interval_s`; the caller stops it (Ctrl-C)."""
    cursors: dict[str, str] = {}
    while True:
        started = time.monotonic()
        batch = read(inventory, unit_name=unit_name, lines=lines, since=since, limit=limit, cursors=cursors)
        cursors = batch.cursors
        yield batch
        sleep(max(0.0, interval_s - (time.monotonic() - started)))
