"""`status`: one row per unit of each host, each with the memory and holders of its own GPUs, out
of the status play's results (read by module, as ansible-runner hands them over); a host with no
orchestrator unit gets one row saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostresults import gpu, result
from rich.console import Console

from orchestrator.cli.view import status_table
from orchestrator.hosts import status_play
from orchestrator.hosts.playvars import PlayVars
from orchestrator.hosts.runner import HostRun, PlayResult, TaskEvent

PY = "/usr/bin/python3"


def ok(host: str, action: str, **fields: object) -> TaskEvent:
    return TaskEvent(host, "ok", "", action, result(action, **fields))


def probe(profile: str, port: int, gpus: list[int], invocation: str, active: bool = True) -> dict:
    state = {"ActiveState": "active" if active else "inactive", "MainPID": "4242" if active else "0"}
    return {
        "installed": True,
        "digest": f"{profile}-digest",
        "profile": profile,
        "unit": f"# profile: {profile}\n",
        "facts": {"profile": profile, "port": port, "gpus": gpus, "speculative": True},
        "state": {**state, "InvocationID": invocation},
        "health_url": f"http://127.0.0.1:{port}/health",
        "health_status": 200 if active else None,
        "healthy": active,
        "uptime_s": 12.0 if active else None,
    }


def journal(invocation: str, *accept: float) -> TaskEvent:
    """ansible.builtin.command's result (Ansible's module: not one module_results.py reads)."""
    argv = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "--output=cat", "--grep=accept len"]
    lines = "".join(f"Decode batch. accept len: {a:.2f}, x\n" for a in accept)
    return TaskEvent("gpu1", "ok", "", "ansible.builtin.command", {"cmd": argv, "stdout": lines})


def holder(gpu: int, pid: int, unit: str, mib: int = 70000) -> dict:
    return {"gpu": gpu, "pid": pid, "process_name": PY, "used_mib": mib, "unit": unit}


def gpu_read(used: dict[int, int], holders: list[dict]) -> dict:
    gpus = [gpu(i, used.get(i, 0)) for i in range(8)]
    return {
        "idle": False,
        "checked": list(range(8)),
        "gpus": gpus,
        "holders": holders,
        "busy": [],
        "killed": [],
    }


@pytest.fixture
def play(monkeypatch: pytest.MonkeyPatch) -> list[PlayVars]:
    """gpu1 runs sglang-a.service (GPUs 0-3, port 30000) and a stopped sglang-b.service (4-7), with
    a stray process on GPU 5; gpu2 has no orchestrator unit; gpu3 is unreachable."""
    a = [holder(i, 1000 + i, "sglang-a.service") for i in range(4)]
    stray = holder(5, 77, "", 4000)
    gpu1 = HostRun("gpu1")
    gpu1.events = [
        ok("gpu1", "sglang_units_info", units=["sglang-a.service", "sglang-b.service"]),
        ok("gpu1", "sglang_probe", **probe("cg_5tok", 30000, [0, 1, 2, 3], "inv-a")),
        journal("inv-a", 3.0, 4.0),
        ok("gpu1", "sglang_probe", **probe("cg_2step", 30001, [4, 5, 6, 7], "", active=False)),
        TaskEvent("gpu1", "skipped", "", "ansible.builtin.command", {}),
        ok("gpu1", "gpu_idle", **gpu_read({0: 70000, 1: 70000, 2: 70000, 3: 70000, 5: 4000}, [*a, stray])),
    ]
    gpu2 = HostRun("gpu2")
    gpu2.events = [ok("gpu2", "sglang_units_info", units=[]), ok("gpu2", "gpu_idle", **gpu_read({}, []))]
    gpu3 = HostRun("gpu3")
    gpu3.events = [TaskEvent("gpu3", "unreachable", "", "sglang_units_info", {"msg": "ssh: no route"})]
    seen: list[PlayVars] = []

    def run_playbook(name: str, inventory: Path, orch: PlayVars, limit: str | None = None) -> PlayResult:
        assert name == "status.yml"
        seen.append(orch)
        return PlayResult(0, "successful", {"gpu3": gpu3, "gpu1": gpu1, "gpu2": gpu2}, Path("."))

    monkeypatch.setattr(status_play, "run_playbook", run_playbook)
    return seen


def test_each_unit_is_a_row_with_its_own_gpus(play):
    rows = status_play.status(Path("hosts.yml"))
    assert play[0].target.unit_name == ""  # every unit of each host
    assert [(r.host, r.unit) for r in rows] == [
        ("gpu1", "sglang-a.service"),
        ("gpu1", "sglang-b.service"),
        ("gpu2", ""),
        ("gpu3", ""),
    ]
    a, b, none, down = rows
    assert (a.profile, a.port, a.gpus, a.active_state, a.main_pid, a.health) == (
        "cg_5tok",
        30000,
        [0, 1, 2, 3],
        "active",
        4242,
        200,
    )
    assert a.gpu_used_mib == 280000 and {h["pid"] for h in a.gpu_holders} == {1000, 1001, 1002, 1003}
    assert a.accept_len == pytest.approx(3.5)  # its own invocation's log lines
    assert (b.active_state, b.health, b.accept_len, b.gpus) == ("inactive", None, None, [4, 5, 6, 7])
    assert b.gpu_used_mib == 4000 and [h["pid"] for h in b.gpu_holders] == [77]  # not sglang-a's
    assert (none.active_state, none.reachable, none.message) == (status_play.NO_UNIT, True, "")
    assert (down.reachable, down.message) == (False, "ssh: no route")


def test_the_json_keys_stay_and_name_the_unit(play):
    row = status_play.status(Path("hosts.yml"), unit_name="sglang-a.service")[0].to_json()
    assert play[0].target.unit_name == "sglang-a.service"
    old = {"host", "reachable", "profile", "digest", "active_state", "main_pid", "uptime_s", "health"}
    old |= {"gpu_used_mib", "gpu_holders", "message", "speculative", "accept_len", "port"}
    assert old | {"unit", "gpus", "foreign", "pd"} == set(row)


def test_a_server_started_by_hand_is_a_row_of_its_own(play, monkeypatch):
    """gpu2 has no orchestrator unit but a server started under nohup: its row says so, with its
    PID, port and the GPU memory it holds, instead of `no unit`."""
    seen = {
        "pid": 5150,
        "user": "root",
        "started": 1.0,
        "ports": [30000],
        "launcher": {"kind": "nohup", "detail": "/data/eagle3/x.log"},
        "argv": ["python3", "-m", "sglang.launch_server", "--api-key", "<secret>"],
        "log": "/data/eagle3/x.log",
    }
    rows = status_play.status(Path("hosts.yml"))
    assert all(r.active_state != status_play.FOREIGN for r in rows)
    hand = holder(0, 5150, "", 9000)
    gpu2 = HostRun("gpu2")
    gpu2.events = [
        ok("gpu2", "sglang_units_info", units=[], foreign=[seen]),
        ok("gpu2", "gpu_idle", **gpu_read({0: 9000}, [hand])),
    ]
    monkeypatch.setattr(
        status_play, "run_playbook", lambda *a, **k: PlayResult(0, "successful", {"gpu2": gpu2}, Path("."))
    )
    (row,) = status_play.status(Path("hosts.yml"))
    assert (row.active_state, row.main_pid, row.port) == ("started by hand (nohup)", 5150, 30000)
    assert row.unit == ""
    assert row.foreign["log"] == "/data/eagle3/x.log" and row.gpu_holders == [hand]
    text = _printed(status_table([row]))
    assert "started by hand (nohup)" in text and "5150" in text


def test_the_table_shows_a_row_per_unit_and_whose_holder_is_whose(play):
    rows = status_play.status(Path("hosts.yml"))
    rows[1].gpu_holders.append(holder(6, 1006, "sglang-a.service", 500))  # a's process on b's GPU 6
    console = Console(width=400, record=True)
    console.print(status_table(rows))
    text = console.export_text()
    assert text.startswith("status ")
    a, b, none = (
        next(line for line in text.splitlines() if key in line)
        for key in ("-a.service", "-b.service", "gpu2")
    )
    assert "│ 30000 │ 0-3 " in a and "│ 3.50 " in a
    assert "1000 /usr/bin/python3 on GPU 0, 70000 MiB;" in a  # its own process: no unit named
    assert (
        "77 /usr/bin/python3 on GPU 5, 4000 MiB; 1006 /usr/bin/python3 on GPU 6, 500 MiB (sglang-a.service)"
        in b
    )
    assert "│ no unit " in none


def _printed(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()
