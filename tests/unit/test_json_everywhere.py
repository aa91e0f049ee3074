"""Every command that prints JSON from the ledger alone prints strict JSON, whatever the ledger holds.

The ledger here has a row in every table, written by the code's own writers: a deploy with its
start-up phases (rollback.record, as deploy and rollback call it), its good unit, bench runs and a
failed one (bench.record, bench.failure_row), a tuning campaign and its trials. Then:
- each ledger-only command's JSON loads with NaN and Infinity refused, and shows the rows;
- a phases value edited by hand (NaN, 1e999, text) is skipped with a note, in text and JSON;
- bench's `accept_len` is the run's own figure; the server's, cumulative since it started, is
  named `accept_len_server_cumulative`.

Commands that need hosts (deploy, rollback, status, preflight, verify, bench, sweep, tune without
--check) are not run here: they talk to the hosts over Ansible. bench is run with its server and
its host look-up replaced, since only its printing is under test.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import ledger
from orchestrator.cli.main import cli
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts.host_report import HostReport
from orchestrator.hosts.module_results import Phase
from orchestrator.hosts.rollback import record as record_deploy
from orchestrator.profile import model as profile_mod
from orchestrator.tuning import bench
from orchestrator.tuning.outcome import Trial

PROFILE = "example:cg_5tok"
CAMPAIGN = "c0ffee000001"
PHASES = [Phase(phase="weights", s=120.5), Phase(phase="graphs", s=40.0), Phase(phase="ready", s=0.0)]


def strict(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as every strict JSON reader does."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    ledger.take_unreadable()  # none left over from another test
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    return inv


def deployed(inventory: Path) -> None:
    """A healthy deploy of PROFILE on gpu1 with its start-up phases, recorded as deploy records it."""
    prof = profile_mod.load(PROFILE)
    _, orch = deploy_mod.planned(prof, inventory, deploy_mod.Options(lock_detached=True), "run1")
    hp = orch.hosts["gpu1"]
    report = HostReport(host="gpu1", ok=True, step="health", changed=True, restarted=True, digest=hp.digest)
    report.elapsed_s, report.phases = 171.0, [p.model_dump() for p in PHASES]
    record_deploy("run1", report, hp, "deploy")


def stream(gap: float, verify_ct: int) -> bench.Stream:
    """A request of 26 tokens in four chunks, `gap` seconds apart."""
    events = [(0.05 + i * gap, n) for i, n in enumerate((2, 12, 22, 26))]
    return bench.Stream(sent=0.0, events=events, done=events[-1][0], verify_ct=verify_ct)


def result(
    profile: str, *, gap: float, verify_ct: int, server: float, endpoint: str = "generate"
) -> bench.BenchResult:
    """A speculative run of two requests whose own accept length is 26 / verify_ct, while the
    server's figure (cumulative since it started) is `server`."""
    target = bench.Target("gpu1", "10.0.0.1", 30000, profile, "d1")
    settings = bench.Settings(requests=2, concurrency=1, max_tokens=26, endpoint=endpoint)
    streams = [stream(gap, verify_ct), stream(gap, verify_ct)]
    run = bench.BenchResult(target, settings, streams, 2 * 3 * gap + 0.1, "0.5.9", speculative=True)
    run.accept_len = server
    return run


def full_ledger(inventory: Path) -> None:
    """A row in every table, each through the writer the code uses."""
    deployed(inventory)
    for gap in (0.10, 0.11, 0.10):  # a baseline's three runs at one level
        run = result("baseline", gap=gap, verify_ct=26, server=1.0)
        run.speculative, run.accept_len = False, 1.0
        bench.record(run, CAMPAIGN)
    for _ in range(2):  # the same figure twice: no spread at all
        bench.record(result("cg_5tok", gap=0.05, verify_ct=9, server=2.3), CAMPAIGN)
    failed = bench.failure_row(bench.Target("gpu1", "10.0.0.1", 30000, "cg_16tok"), bench.Settings(), "OOM")
    ledger.record_bench(failed)
    ledger.record_campaign(
        {
            "id": CAMPAIGN,
            "space_path": "space.yml",
            "space_digest": "abc",
            "space": "extends: example:cg_5tok\n",
            "hosts": json.dumps(["gpu1"]),
            "status": "running",
        }
    )
    prof = profile_mod.load(PROFILE)
    for number, kind, value in ((-1, "baseline", 1.0), (0, "trial", 1.7)):
        trial = Trial(number, kind, {"speculative.num_steps": 3}, prof, "gpu1", "complete", value)
        ledger.record_trial(trial.row(CAMPAIGN))
    ledger.update_campaign(CAMPAIGN, status="done", outcome=json.dumps({"verdict": "cg_5tok wins"}))
    adoption = {"argv": ["python3", "-m", "sglang.launch_server"], "cwd": "/", "user": "root", "log": ""}
    row = {"host": "gpu1", "unit_name": "sglang.service", "profile": "adopted", "pid": 4242}
    row |= {"start_ticks": 1234, "port": 30000, "command": json.dumps(adoption), "state": "pending"}
    ledger.record_adoption(row)


def space_file(folder: Path) -> Path:
    data = {
        "extends": PROFILE,
        "baseline": "example:baseline",
        "vary": {"speculative.num_steps": [2, 3]},
        "traffic": {"concurrency": [1], "requests": 2, "max_tokens": 26},
        "objective": {"maximize": "tok_s", "at_concurrency": 1},
        "budget": {"restarts": 4},
    }
    path = folder / "space.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def invoke(*args: str) -> Result:
    done = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in done.output and "internal error" not in done.output, done.output
    return done


def check_history(data: Any) -> None:
    [row] = data
    assert (row["host"], row["result"], row["duration_s"]) == ("gpu1", "healthy", 171.0)
    assert row["phases"] == [p.model_dump() for p in PHASES]


def check_results(data: Any) -> None:
    assert [r["profile"] for r in data] == ["baseline"] * 3 + ["cg_5tok"] * 2 + ["cg_16tok"]
    assert {r["sweep_id"] for r in data[:5]} == {CAMPAIGN}
    assert data[-1]["result"] == "failed" and data[-1]["diagnosis"] == "OOM"
    compared = data[3]["comparison"]
    assert compared["profile"] == "cg_5tok" and compared["runs"] == 2 and compared["baseline"] == "baseline"


def check_plan(data: Any) -> None:
    host = data["orch"]["hosts"]["gpu1"]
    assert host["usual_s"] == {"weights": 120.5, "graphs": 40.0, "ready": 0.0}


def check_render(data: Any) -> None:
    assert data["argv"] and "ExecStart=" in data["unit"]


LEDGER_COMMANDS = {
    "history --json": (["history", "--json"], check_history),
    "history --host --json": (["history", "--host", "gpu1", "--json"], check_history),
    "results --format json": (["results", "--format", "json"], check_results),
    "plan": (["plan", "-p", PROFILE, "-i", "{inventory}"], check_plan),
    "render --json": (["render", "-p", PROFILE, "--json"], check_render),
}


@pytest.mark.parametrize("name", list(LEDGER_COMMANDS))
def test_each_ledger_command_prints_strict_json_of_a_ledger_with_every_table(
    name: str, inventory: Path
) -> None:
    full_ledger(inventory)
    args, check = LEDGER_COMMANDS[name]
    done = invoke(*(a.format(inventory=inventory) for a in args))
    assert done.exit_code == 0, done.output
    assert done.stderr == "", done.stderr
    check(strict(done.stdout))


def test_tune_check_prints_strict_json_of_a_ledger_with_every_table(inventory: Path) -> None:
    full_ledger(inventory)
    done = invoke("tune", str(space_file(inventory.parent)), "--check", "--json", "-i", str(inventory))
    assert done.exit_code == 0, done.output
    strict(done.stdout)


# --- phases edited by hand -------------------------------------------------------------------

#: A phases value as a hand edit leaves it (JSON text in the column), and what the note says.
BAD_PHASES = [
    ('[{"phase": "weights", "s": NaN}]', "phases holds {'phase': 'weights', 's': nan}, its s is NaN"),
    (
        '[{"phase": "weights", "s": 1e999}]',
        "phases holds {'phase': 'weights', 's': inf}, its s is out of range",
    ),
    ('[{"phase": "weights", "s": -Infinity}]', "phases holds {'phase': 'weights', 's': -inf}, its s is out"),
    (
        '[{"phase": "weights", "s": "2m"}]',
        "phases holds {'phase': 'weights', 's': '2m'}, its s is not a number",
    ),
    ('[{"phase": "weights", "s": -3}]', "phases holds {'phase': 'weights', 's': -3}, its s is out of range"),
    (
        '[{"phase": "weights", "s": true}]',
        "phases holds {'phase': 'weights', 's': True}, its s is not a number",
    ),
    ('[{"s": 3.0}]', "phases holds {'s': 3.0}, not a phase ({phase: name, s: seconds})"),
    ("[7]", "phases holds 7, not a phase ({phase: name, s: seconds})"),
]


def hand_edit(phases: str) -> None:
    """The first phase of the deploy row replaced, as with the sqlite3 shell; the others kept."""
    kept = json.dumps([p.model_dump() for p in PHASES[1:]])
    conn = sqlite3.connect(ledger.path())
    conn.execute("UPDATE deploys SET phases=?", (phases[:-1] + ", " + kept[1:],))
    conn.commit()
    conn.close()


def one_note(done: Result, what: str, skipped: str = "phase") -> None:
    assert done.exit_code == 0, done.output
    [note] = done.stderr.splitlines()
    assert note.startswith(f"note: ledger {ledger.path()}: deploys row id 1: {what}"), note
    assert note.endswith(f"; the {skipped} is skipped (correct or delete it)"), note


@pytest.mark.parametrize(("phases", "what"), BAD_PHASES, ids=[p for p, _ in BAD_PHASES])
def test_a_phase_edited_by_hand_is_skipped_with_a_note(phases: str, what: str, inventory: Path) -> None:
    deployed(inventory)
    hand_edit(phases)
    done = invoke("plan", "-p", PROFILE, "-i", str(inventory))
    host = strict(done.stdout)["orch"]["hosts"]["gpu1"]
    one_note(done, what)
    assert host["usual_s"] == {"graphs": 40.0, "ready": 0.0} and "weights" not in host["stall_s"]
    done = invoke("history", "--json")
    one_note(done, what)
    assert strict(done.stdout)[0]["phases"] == [p.model_dump() for p in PHASES[1:]]
    done = invoke("history")
    one_note(done, what)
    assert "CUDA graphs 40s" in done.stdout


@pytest.mark.parametrize("phases", ["not json", '{"weights": 3}', "NaN"])
def test_phases_that_are_not_a_json_list_are_skipped_with_a_note(phases: str, inventory: Path) -> None:
    deployed(inventory)
    conn = sqlite3.connect(ledger.path())
    conn.execute("UPDATE deploys SET phases=?", (phases,))
    conn.commit()
    conn.close()
    for args in (["history", "--json"], ["plan", "-p", PROFILE, "-i", str(inventory)]):
        done = invoke(*args)
        one_note(done, f"phases holds {phases!r}, not a JSON list", skipped="value")
        strict(done.stdout)
    assert strict(invoke("history", "--json").stdout)[0]["phases"] == []


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def test_whatever_a_phase_holds_history_and_plan_print_strict_json(inventory: Path) -> None:
    deployed(inventory)

    @settings(max_examples=25, deadline=None)
    @given(seconds=JSON_VALUES)
    def prints_strict_json(seconds: Any) -> None:
        hand_edit(json.dumps([{"phase": "weights", "s": seconds}]))  # NaN, Infinity as Python writes them
        for args in (["history", "--json"], ["plan", "-p", PROFILE, "-i", str(inventory)]):
            done = invoke(*args)
            assert done.exit_code == 0, done.output
            strict(done.stdout)

    prints_strict_json()


# --- a run's own accept length ---------------------------------------------------------------


@pytest.fixture
def server(inventory: Path, monkeypatch: pytest.MonkeyPatch) -> list[bench.BenchResult]:
    """bench's server: each run is the next of these. The host look-up and its journal are left out
    (they need a host); bench's own curve, recording and printing run as they do."""
    runs = [
        result("cg_5tok", gap=0.05, verify_ct=9, server=2.3),  # code prompts: 26/9 = 2.89 a round
        result("cg_5tok", gap=0.07, verify_ct=15, server=2.3, endpoint="chat"),  # chat: 26/15 = 1.73
    ]
    monkeypatch.setattr(bench, "find_target", lambda inv, limit, prof: runs[0].target)
    monkeypatch.setattr(bench, "journal_messages", lambda inv, host: lambda since: [])

    def run(target: bench.Target, settings: bench.Settings, *rest: Any, **kw: Any) -> bench.BenchResult:
        done = runs.pop(0)
        done.settings = settings  # as bench asked: its endpoint, its level
        return done

    monkeypatch.setattr(bench, "run", run)
    return runs


def test_bench_json_gives_the_runs_own_accept_length_and_names_the_servers(
    server: list[bench.BenchResult], inventory: Path
) -> None:
    """Two benches on one server whose /get_server_info says 2.30 all along: each run's own figure
    is what `accept_len` says; the server's is `accept_len_server_cumulative`."""
    code = strict(invoke("bench", "-i", str(inventory), "--json").stdout)
    chat = strict(invoke("bench", "-i", str(inventory), "--endpoint", "chat", "--json").stdout)
    assert (round(code["accept_len"], 2), round(chat["accept_len"], 2)) == (2.89, 1.73)
    assert code["accept_len_server_cumulative"] == chat["accept_len_server_cumulative"] == 2.3
    assert code["accept_len_client"] == code["accept_len"] and code["ledger_id"] == 1
    # results prints the same figures from the rows (the ledger's columns keep their names)
    rows = strict(invoke("results", "--format", "json").stdout)
    assert [round(r["accept_len"], 2) for r in rows] == [2.89, 1.73]
    assert [r["accept_len_server_cumulative"] for r in rows] == [2.3, 2.3]
    assert [r["accept_len"] for r in ledger.bench_results()] == [2.3, 2.3]
    table = invoke("results").stdout
    assert "2.89" in table and "1.73" in table and "2.30" not in table


def test_bench_text_names_the_servers_cumulative_accept_length(
    server: list[bench.BenchResult], inventory: Path
) -> None:
    done = invoke("bench", "-i", str(inventory))
    assert done.exit_code == 0, done.output
    [own] = [
        line for line in done.stdout.splitlines() if "accept length " in line and "cumulative" not in line
    ]
    [since] = [line for line in done.stdout.splitlines() if "accept length, server cumulative" in line]
    assert "2.89 (client 2.89, log -)" in own and "2.30" in since


def test_a_curves_json_runs_carry_their_own_accept_length(
    server: list[bench.BenchResult], inventory: Path
) -> None:
    data = strict(invoke("bench", "-i", str(inventory), "-c", "1,8", "--json").stdout)
    assert [round(r["accept_len"], 2) for r in data["runs"]] == [2.89, 1.73]
    assert [r["accept_len_server_cumulative"] for r in data["runs"]] == [2.3, 2.3]
    assert [round(lv["accept_len"], 2) for lv in data["levels"]] == [2.89, 1.73]
