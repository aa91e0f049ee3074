"""Text a user, a ledger row or a host wrote is printed as text (issue 21, classes 8 and 9).

Rich markup such as `[/bold]` or `[link=...]` is shown as written (it raised MarkupError, a
traceback), and control characters are escaped: ESC is shown as `\\x1b`, so a profile's description,
a ledger row or a server's journal can never set the terminal's title or clear it. Ordinary
non-ASCII text (é) stays as it is. JSON output stays JSON: json.dumps escapes them itself.

Each test runs the real command (click's CliRunner) and checks what the user sees: the exit code,
no traceback, no raw ESC byte, the text shown escaped.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from hostresults import result

from orchestrator import ledger
from orchestrator.cli.console import handle_errors, shown
from orchestrator.cli.main import cli
from orchestrator.errors import InputError
from orchestrator.hosts import logs_play, status_play
from orchestrator.hosts.runner import HostRun, PlayResult, TaskEvent
from orchestrator.profile import model as profile_mod

#: What a hostile profile, ledger row or host writes: markup, an OSC title, a screen clear, é.
HOSTILE = "[/bold]\x1b]0;pwned\x07\x1b[2J[link=http://e.invalid]é[/link]"
#: How it must look on the screen.
SHOWN = "[/bold]\\x1b]0;pwned\\x07\\x1b[2J[link=http://e.invalid]é[/link]"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    yield tmp_path / "state"
    profile_mod.use_profiles_dir(None)


def as_text(done: Result, *codes: int) -> str:
    """The command's whole output, checked: an expected exit code, no traceback, no raw ESC."""
    shown_all = f"exit {done.exit_code}\n{done.output}\n{done.exception!r}"
    assert done.exit_code in (codes or (0,)), shown_all
    assert "Traceback" not in done.output, shown_all
    assert "\x1b" not in done.output and "\x07" not in done.output, shown_all
    return done.output


def column(table: str, index: int) -> str:
    """A rich table's column `index` (of the cells between │), its folded lines joined up."""
    cells = [line.split("│") for line in table.splitlines() if line.startswith("│")]
    return "".join(cell[index].strip() for cell in cells)


def test_shown_escapes_control_characters_and_keeps_the_rest() -> None:
    assert shown(HOSTILE) == SHOWN
    assert shown("tab\there, é, 中, ☃") == "tab\\there, é, 中, ☃"
    assert shown("a\tb\nc", keep="\t") == "a\tb\\nc"
    assert shown("\x9b2J\u202e\udcff") == "\\x9b2J\\u202e\\udcff"  # C1 CSI, a bidi override, a bad byte


def test_profiles_shows_a_description_and_a_folder_with_markup_and_escapes_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "p[/bold]\x1b[2J"  # "p[" holding "bold]\x1b[2J"
    folder.mkdir(parents=True)
    (folder / "mine.yml").write_text(yaml.safe_dump({"extends": "example:base", "description": HOSTILE}))
    text = as_text(CliRunner().invoke(cli, ["--profiles-dir", str(folder), "profiles"]))
    assert SHOWN in column(text, -2)
    assert "profiles folder: " + str(folder).replace("\x1b", "\\x1b") in text


def test_profiles_shows_a_file_name_with_an_escape_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "x\x1b[2J.yml").write_text("extends: example:base\n")
    done = CliRunner().invoke(cli, ["--profiles-dir", str(folder), "profiles"])
    text = as_text(done, 2)  # its name is not a profile name: listed as invalid, and said why
    assert "x\\x1b[2J" in done.stdout and "invalid: run `validate`" in done.stdout
    assert "x\\x1b[2J" in done.stderr and "name:" in done.stderr, text


def test_validate_names_a_path_with_markup_and_escapes_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "[/bold]\x1b]0;pwned\x07"
    folder.mkdir(parents=True)
    (folder / "bad.yml").write_text("extends: example:base\nserver: {tp_size: 0}\n")
    done = CliRunner().invoke(cli, ["validate", "-p", str(folder / "bad.yml")])
    as_text(done, 2)
    assert done.stderr.startswith(f"{tmp_path}/[/bold]\\x1b]0;pwned\\x07/bad.yml: server.tp_size: ")
    assert len(done.stderr.splitlines()) == 1


def test_render_against_shows_changed_values_as_text_and_json_keeps_them(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yml"
    mine.write_text(yaml.safe_dump({"extends": "example:base", "env": {"A": HOSTILE}}))
    text = as_text(CliRunner().invoke(cli, ["render", "-p", str(mine), "--against", "example:base"]))
    assert f"env A: (unset) -> {SHOWN}" in text
    as_json = CliRunner().invoke(cli, ["render", "-p", str(mine), "--against", "example:base", "--json"])
    assert "\x1b" not in as_json.output
    assert json.loads(as_json.output)["changes"] == [f"env A: (unset) -> {HOSTILE}"]


def test_render_of_a_profile_full_of_escapes_writes_none(tmp_path: Path) -> None:
    """The unit is printed byte for byte, and its quoting escapes a control character itself."""
    mine = tmp_path / "mine.yml"
    doc = {"extends": "example:base", "description": HOSTILE, "env": {"A": HOSTILE}}
    mine.write_text(yaml.safe_dump({**doc, "server": {"extra_args": ["--chat-template", HOSTILE]}}))
    for extra in ([], ["--json"]):
        as_text(CliRunner().invoke(cli, ["render", "-p", str(mine), *extra]))


def deploy_row(host: str, diagnosis: str = "", result: str = "failed") -> None:
    row = ledger.DeployRow(
        "r1", host, "sglang.service", "cg_5tok", "d1", "deploy", result, True, 3.0, diagnosis
    )
    ledger.record_deploy(row)


def test_history_shows_ledger_text_with_markup_and_escapes_as_text() -> None:
    deploy_row(HOSTILE, diagnosis=f"journal: {HOSTILE}")
    deploy_row("[/bold]", result="healthy")
    text = as_text(CliRunner().invoke(cli, ["history"]))
    assert column(text, 2) == f"[/bold]{SHOWN}" and column(text, -2) == f"journal: {SHOWN}".replace(" ", "")
    rows = json.loads(CliRunner().invoke(cli, ["history", "--json"]).output)
    assert [r["host"] for r in rows] == ["[/bold]", HOSTILE]


def test_results_shows_ledger_text_with_markup_and_escapes_as_text() -> None:
    base = {"run_id": "r", "host": HOSTILE, "result": "failed", "diagnosis": HOSTILE}
    ledger.record_bench(base | {"profile": "[/bold]", "sglang_version": "[red]"})
    ledger.record_bench(base | {"profile": "cg", "result": "ok", "tok_s": 80.0, "notes": HOSTILE})
    text = as_text(CliRunner().invoke(cli, ["results"]))
    assert column(text, 2) == SHOWN * 2 and column(text, 3) == "[/bold]cg" and column(text, 5) == "[red]"
    assert column(text, -2) == SHOWN * 2
    assert SHOWN in as_text(CliRunner().invoke(cli, ["results", "--format", "csv"]))
    rows = json.loads(CliRunner().invoke(cli, ["results", "--format", "json"]).output)
    assert [r["host"] for r in rows] == [HOSTILE, HOSTILE]


def test_status_shows_what_a_host_says_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's state file (its profile, its digest) and an unreachable host's message, as the
    status play hands them over."""
    probe = result(
        "sglang_probe",
        installed=True,
        digest="\x1b[2J",
        profile="[/b]\x1b]0;t\x07",  # short: the status table has 13 columns to fit
        facts={"profile": "p", "port": 30000, "gpus": [0]},
        state={"ActiveState": "on\x1b[31m", "MainPID": "42", "InvocationID": ""},
        health_url="http://127.0.0.1:30000/health",
        health_status=200,
        uptime_s=1.0,
    )
    gpu1 = HostRun("[/bold]")
    gpu1.events = [
        TaskEvent(
            "[/bold]", "ok", "", "sglang_units_info", result("sglang_units_info", units=["sglang.service"])
        ),
        TaskEvent("[/bold]", "ok", "", "sglang_probe", probe),
    ]
    gpu2 = HostRun("gpu2")
    gpu2.events = [TaskEvent("gpu2", "unreachable", "", "sglang_units_info", {"msg": f"ssh: {HOSTILE}"})]

    def run_playbook(name: str, inventory: Path, orch: object, limit: str | None = None) -> PlayResult:
        return PlayResult(0, "successful", {"[/bold]": gpu1, "gpu2": gpu2}, Path("."))

    monkeypatch.setattr(status_play, "run_playbook", run_playbook)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1:\n    gpu2:\n")
    done = CliRunner().invoke(cli, ["status", "-i", str(inventory)])
    text = as_text(done, 1)  # 1: a host was not read
    assert column(done.stdout, 1).startswith("[/bold]") and column(done.stdout, 3).startswith(
        "[/b]\\x1b]0;t\\x07"
    )
    assert column(done.stdout, 4).startswith("\\x1b[2J") and "on\\x1b[31m" in column(done.stdout, 7)
    assert done.stderr.endswith(f"gpu2: ssh: {SHOWN}\n"), text


def test_logs_escape_a_journal_line_but_keep_its_tabs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.cli import logs_command

    when = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    batch = logs_play.LogBatch(
        hosts=["gpu1"],
        lines=[
            logs_play.LogLine("gpu1", when, 1, f"a\tb {HOSTILE}"),
            logs_play.LogLine("gpu1", when, 1, "ok"),
        ],
        failures=[logs_play.HostFailure("gpu2", f"sudo: {HOSTILE}", unreachable=False)],
    )
    monkeypatch.setattr(logs_command.logs_play, "read", lambda *args, **kwargs: batch)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1:\n")
    done = CliRunner().invoke(cli, ["logs", "-i", str(inventory)])
    as_text(done, 1)
    assert f"b {SHOWN}\n" in done.stdout and "\\t" not in done.stdout  # rich lays the tab out as spaces
    assert done.stderr == f"gpu2: journal not read: sudo: {SHOWN}\n"


@pytest.mark.parametrize("raised", [InputError(HOSTILE), RuntimeError(HOSTILE)])
def test_an_error_quoting_hostile_text_is_one_escaped_line(raised: Exception) -> None:
    import click

    @click.command()
    @handle_errors
    def fails() -> None:
        raise raised

    done = CliRunner().invoke(fails)
    as_text(done, 1, 2)
    assert len(done.output.splitlines()) == 1 and SHOWN in done.output
