"""Every numeric option takes plain ASCII decimal text within its range, and nothing else.

Each command runs through the real `orchestrator` group, with its body replaced by a recorder: a
value the options accept reaches it, and no host is ever asked. A refusal is click's usage error,
exit 2, naming the option.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from orchestrator import api
from orchestrator.cli import bench_commands, host_commands, lab_command, logs_command
from orchestrator.cli.main import cli
from orchestrator.errors import InputError

#: The commands whose options are read here, by their argv, with their bodies.
COMMANDS: dict[tuple[str, ...], click.Command] = {
    ("bench",): bench_commands.bench,
    ("sweep",): bench_commands.sweep,
    ("results",): bench_commands.results,
    ("deploy", "-p", "x"): host_commands.deploy,
    ("plan", "-p", "x"): host_commands.plan_command,
    ("history",): host_commands.history,
    ("logs",): logs_command.logs,
    ("lab", "up"): lab_command.up,
    ("lab", "gateway", "up"): lab_command.gateway_up,
}

#: lab_command.py is not this change's file: its click.IntRange still reads 1_0 as 10.
#: (argv before the option, option, the keyword the command gets, kind, low, high); `open` kinds
#: exclude `low`. The ranges are what each option's --help shows.
OPTIONS = [
    *[
        pytest.param(cmd, *rest, id=f"{cmd[0]}{rest[0]}")
        for cmd in (("bench",), ("sweep",))
        for rest in [
            ("--requests", "requests", "int", 1, 100_000),
            ("--concurrency", "concurrency", "ints", 1, 1024),
            ("--request-rate", "request_rate", "floats", 0.001, 100_000),
            ("--max-tokens", "max_tokens", "int", 2, 1_000_000),
            ("--warmup", "warmup", "int", 0, 1000),
            ("--temperature", "temperature", "float", 0, 2),
            ("--seed", "seed", "int", 0, 2**31 - 1),
            ("--repeat", "repeat", "int", 1, 100),
        ]
    ],
    pytest.param(("results",), "--concurrency", "concurrency", "int", 0, 1024, id="results--concurrency"),
    pytest.param(
        ("results",), "--request-rate", "request_rate", "open float", 0, 100_000, id="results--request-rate"
    ),
    pytest.param(("results",), "--temperature", "temperature", "float", 0, 2, id="results--temperature"),
    pytest.param(("results",), "--seed", "seed", "int", 0, 2**31 - 1, id="results--seed"),
    pytest.param(("results",), "--last", "last", "int", 0, 10**9, id="results--last"),
    *[
        pytest.param(cmd, *rest, id=f"{cmd[0]}{rest[0]}")
        for cmd in (("deploy", "-p", "x"), ("plan", "-p", "x"))
        for rest in [
            ("--lock-wait", "lock_wait", "float", 0, 86400),
            ("--max-fail-percent", "max_fail_percent", "int", 0, 100),
            ("--drain-timeout", "drain_timeout", "float", 0, 86400),
        ]
    ],
    pytest.param(("deploy", "-p", "x"), "--forks", "forks", "int", 1, 5000, id="deploy--forks"),
    pytest.param(
        ("deploy", "-p", "x"), "--canary-margin", "canary_margin", "float", 0, 1, id="deploy--canary-margin"
    ),
    pytest.param(("history",), "--last", "count", "int", 1, 10000, id="history--last"),
    pytest.param(("logs",), "--lines", "lines", "int", 0, 2**31 - 1, id="logs--lines"),
    pytest.param(("lab", "up"), "--hosts", "hosts", "int", 1, 50, id="lab-up--hosts"),
    pytest.param(("lab", "up"), "--gpus", "gpus", "int", 1, 64, id="lab-up--gpus"),
    pytest.param(("lab", "gateway", "up"), "--port", "port", "int", 1, 65534, id="lab-gateway--port"),
    pytest.param(
        ("lab", "gateway", "up"),
        "--worker-port",
        "worker_port",
        "int",
        1,
        65535,
        id="lab-gateway--worker-port",
    ),
    pytest.param(
        ("lab", "gateway", "up"),
        "--bootstrap-port",
        "bootstrap_port",
        "int",
        1,
        65535,
        id="lab-gateway--bootstrap-port",
    ),
    pytest.param(
        ("lab", "gateway", "up"),
        "--health-interval",
        "health_interval",
        "int",
        1,
        3600,
        id="lab-gateway--health-interval",
    ),
]

#: What a person means by a number: ASCII digits, a leading '-', and for a decimal a '.' and an
#: exponent. Python's int() and float() take more (1_0, other scripts' digits, nan, inf, spaces).
WHOLE = re.compile(r"-?[0-9]+")
DECIMAL = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")


def reading(text: str, kind: str) -> Any:
    """The ASCII-decimal reading of `text` as `kind`, or None where it has none."""
    if kind in ("ints", "floats"):
        items = [reading(part.strip(" "), kind[:-1]) for part in text.split(",")]
        return None if None in items else tuple(items)
    if kind == "int":
        return int(text) if WHOLE.fullmatch(text) and len(text) < 100 else None
    return float(text) if DECIMAL.fullmatch(text) else None


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch, state: Path) -> dict[str, Any]:
    """What each command's body would get: every body is replaced by a recorder."""
    seen: dict[str, Any] = {}
    for command in COMMANDS.values():
        monkeypatch.setattr(command, "callback", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    monkeypatch.setattr("getpass.getpass", lambda prompt: pytest.fail(f"asked {prompt!r}"))
    return seen


def invoke(argv: list[str]) -> Any:
    return CliRunner().invoke(cli, argv)


def assert_refused(done: Any, option: str) -> None:
    """Click's usage error naming the option: exit 2, no traceback, no internal error."""
    assert done.exit_code == 2, done.output
    assert isinstance(done.exception, SystemExit), done.exception
    assert f"Invalid value for '{option}'" in done.output, done.output
    assert "Traceback" not in done.output


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (["bench", "--temperature", "nan"], "--temperature", "nan"),
        (["results", "--temperature", "inf"], "--temperature", "inf"),
        (["sweep", "a", "b", "--temperature", "nan"], "--temperature", "nan"),
        (["results", "--request-rate", "nan"], "--request-rate", "nan"),
        (["sweep", "a", "--temperature", "1e-400"], "--temperature", "1e-400"),
        (["results", "--request-rate", "inf"], "--request-rate", "inf"),
        (["results", "--request-rate", "1e400"], "--request-rate", "1e400"),
        (["results", "-c", "99999999999999999999"], "--concurrency", "99999999999999999999"),
        (["bench", "-c", "99999999999999999999"], "--concurrency", "99999999999999999999"),
        (["results", "--seed", str(2**70)], "--seed", str(2**70)),
        (["logs", "-n", str(2**70)], "--lines", str(2**70)),
        (["deploy", "-p", "x", "--forks", "1_0"], "--forks", "1_0"),
        (["results", "-c", "1_0"], "--concurrency", "1_0"),
        (["bench", "-c", "1_0"], "--concurrency", "1_0"),
        (["sweep", "a", "-c", "1,1_0"], "--concurrency", "1_0"),
        (["results", "-c", "\u0663"], "--concurrency", "\u0663"),
        (["bench", "-c", "\u0663"], "--concurrency", "\u0663"),
        (["results", "-c", "\uff13"], "--concurrency", "\uff13"),
        (["sweep", "a", "-c", "\uff13"], "--concurrency", "\uff13"),
    ],
)
def test_the_reviewed_numbers_are_refused_by_the_option(
    received: dict[str, Any], argv: list[str], option: str, value: str
) -> None:
    done = invoke(argv)
    assert_refused(done, option)
    assert value in done.output
    assert received == {}


@pytest.mark.parametrize(("argv", "option", "keyword", "kind", "low", "high"), OPTIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(
        st.text(max_size=24),
        st.from_regex(WHOLE, fullmatch=True),
        st.from_regex(DECIMAL, fullmatch=True),
        st.integers(min_value=-(2**80), max_value=2**80).map(str),
        st.floats().map(str),
        st.lists(st.integers(min_value=-5, max_value=2000).map(str), min_size=1, max_size=4).map(",".join),
        st.sampled_from(["nan", "-inf", "1e400", "1e-400", "1_0", "\u0663", "\uff13", " 1", "1.", ".5"]),
        st.sampled_from(["", "1,,2", "2,2", "1, 8", "0x10", "+1", "1\n"]),
    )
)
@example(text="1_0")
@example(text="nan")
def test_every_numeric_option_refuses_or_reads_ascii_decimal(
    received: dict[str, Any],
    argv: tuple[str, ...],
    option: str,
    keyword: str,
    kind: str,
    low: float,
    high: float,
    text: str,
) -> None:
    received.clear()
    done = invoke([*argv, f"{option}={text}"])
    event("refused" if done.exit_code else "accepted")
    if done.exit_code != 0:
        assert_refused(done, option)
        return
    want = reading(text, kind.removeprefix("open "))
    assert want is not None, f"{option} took {text!r}, which is not a number in ASCII decimal"
    got = received[keyword]
    assert got == want
    for number in got if isinstance(got, tuple) else (got,):
        assert math.isfinite(number) and number <= high
        assert number > low if kind.startswith("open") else number >= low


def test_every_numeric_option_takes_its_whole_range_and_shows_it(received: dict[str, Any]) -> None:
    """Each option takes both ends of its range, refuses past them, and shows the range in --help.
    A numeric option added later must join OPTIONS, so the property above reads it too."""
    kinds = {"integer", "float", "integer range", "float range", "N[,N...]", "R[,R...]"}
    numeric = {(argv, p.name) for argv, cmd in COMMANDS.items() for p in cmd.params if p.type.name in kinds}
    assert numeric == {(p.values[0], p.values[2]) for p in OPTIONS}
    for argv, option, keyword, kind, low, high in (p.values for p in OPTIONS):
        opened = kind.startswith("open")
        if kind not in ("ints", "floats"):  # a list's range is in its refusals only
            assert f"{low}{'<' if opened else '<='}x<={high}" in invoke([*argv, "--help"]).output, option
        for number, taken in ((low, not opened), (high, True), (low - 1, False), (high + 1, False)):
            received.clear()
            done = invoke([*argv, f"{option}={number}"])
            if taken:
                assert done.exit_code == 0, done.output
                assert received[keyword] == ((number,) if kind in ("ints", "floats") else number)
            else:
                assert_refused(done, option)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("request_rate", math.nan),
        ("request_rate", math.inf),
        ("timeout_s", math.nan),
        ("concurrency", True),
        ("seed", 2**70),
        ("requests", 10**20),
    ],
)
def test_bench_settings_from_the_api_refuse_what_the_options_refuse(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=f"{field} {re.escape(repr(value))}"):
        api.Settings(**{field: value})
