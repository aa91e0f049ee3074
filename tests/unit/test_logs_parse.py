"""logs: journalctl's JSON parsed, hosts merged by time, and the line a user reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from rich.console import Console

from orchestrator.cli.logs_command import format_line
from orchestrator.hosts import logs_play

# 2026-11-29 13:40:01.123456 UTC in journalctl's microseconds.
T0 = 1795959601123456


def entry(micros: int, message: object, pid: str | None = "131", cursor: str = "") -> dict:
    """One object as `journalctl -o json` writes it (every value a string, or a byte list)."""
    e = {"__REALTIME_TIMESTAMP": str(micros), "MESSAGE": message, "__CURSOR": cursor or f"c{micros}"}
    if pid is not None:
        e["_PID"] = pid
    return e


def stdout(*entries: dict) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


def test_entry_keeps_microseconds_and_pid():
    line = logs_play.parse_entry("lab1", entry(T0, "ready"))
    assert line == logs_play.LogLine(
        "lab1", datetime(2026, 11, 29, 13, 40, 1, 123456, tzinfo=UTC), 131, "ready"
    )


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (list(b"bad \xff byte"), "bad \ufffd byte"),  # journalctl's form for non-UTF-8
        (list("naïve".encode()), "naïve"),
        (None, logs_play.TOO_LARGE),  # above journalctl's field size threshold
        ("[red]literal[/red]", "[red]literal[/red]"),
    ],
)
def test_message_forms(message, text):
    assert logs_play.parse_entry("h", entry(T0, message)).message == text


def test_entry_without_pid():
    assert logs_play.parse_entry("h", entry(T0, "x", pid=None)).pid is None


def test_first_read_comes_newest_first_and_is_turned_round():
    out = stdout(entry(T0 + 2, "c"), entry(T0 + 1, "b"), entry(T0, "a"))
    lines, cursor = logs_play.parse_journal("h", out, newest_first=True)
    assert [line.message for line in lines] == ["a", "b", "c"]
    assert cursor == f"c{T0 + 2}"


def test_read_after_a_cursor_is_oldest_first():
    lines, cursor = logs_play.parse_journal(
        "h", stdout(entry(T0, "a"), entry(T0 + 1, "b")), newest_first=False
    )
    assert [line.message for line in lines] == ["a", "b"]
    assert cursor == f"c{T0 + 1}"


def test_empty_journal_has_no_cursor():
    assert logs_play.parse_journal("h", "", newest_first=True) == ([], "")


def test_merge_interleaves_hosts_by_time():
    a = [logs_play.parse_entry("lab1", entry(T0 + t, f"a{t}")) for t in (0, 20, 40)]
    b = [logs_play.parse_entry("lab2", entry(T0 + t, f"b{t}")) for t in (10, 30)]
    merged = logs_play.merge([a, b])
    assert [line.message for line in merged] == ["a0", "b10", "a20", "b30", "a40"]


def test_merge_keeps_each_hosts_order_when_its_clock_steps_back():
    a = [logs_play.parse_entry("lab1", entry(T0 + t, f"a{t}")) for t in (50, 10)]
    b = [logs_play.parse_entry("lab2", entry(T0 + 30, "b"))]
    merged = [line.message for line in logs_play.merge([a, b])]
    assert merged.index("a50") < merged.index("a10")


def test_request_first_read_is_reversed_and_follow_goes_forward():
    req = logs_play.request("sglang.service", 5, "10 min ago", {"lab3": "s=1"}).logs
    assert req is not None
    base = ["journalctl", "-u", "sglang.service", "-o", "json", "--output-fields=MESSAGE,_PID", "--no-pager"]
    assert req.first_argv == [*base, "--reverse", "-n", "5", "--since", "10 min ago"]
    assert req.next_argv == [*base, "-n", str(logs_play.FOLLOW_BATCH), "--since", "10 min ago"]
    assert req.cursors == {"lab3": "s=1"}


def test_format_line_pads_host_and_prints_markup_literally():
    line = logs_play.LogLine(
        "lab1", datetime(2026, 11, 29, 13, 40, 1, 123456, tzinfo=UTC), 7, "[red]x[/red]\ny"
    )
    console = Console(record=True, width=200, color_system=None)
    for text in format_line(line, 6):
        console.print(text)
    stamp = line.time.astimezone().strftime("%H:%M:%S.123")
    assert console.export_text() == f"lab1   {stamp} | [red]x[/red]\nlab1   {stamp} | y\n"
