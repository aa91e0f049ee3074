"""The ansible-playbook a run starts is the one of the ansible-core orchestrator imports."""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
from pathlib import Path

import pytest

from orchestrator.hosts import runner


def test_ansible_playbook_comes_from_this_pythons_scripts() -> None:
    ours = sysconfig.get_path("scripts")
    if not os.access(Path(ours, "ansible-playbook"), os.X_OK):
        pytest.skip(f"ansible-core's scripts are not in {ours} (a --user install?)")
    elsewhere = os.pathsep.join(["/usr/local/bin", "/usr/bin", ours, "/bin"])
    path = runner._path_first_ours(elsewhere)
    assert path.split(os.pathsep)[0] == ours and path.split(os.pathsep).count(ours) == 1
    found = shutil.which("ansible-playbook", path=path)
    assert found == runner.ansible_command("ansible-playbook") == str(Path(ours, "ansible-playbook"))


def test_a_play_is_canceled_by_int_term_or_hup_but_an_ignored_hangup_stays_ignored() -> None:
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with runner._interrupts() as interrupted:
                assert not interrupted()
                signal.raise_signal(sig)
                assert interrupted()
            assert signal.getsignal(sig) == before[sig]  # handlers put back
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        with runner._interrupts() as interrupted:
            signal.raise_signal(signal.SIGHUP)
            assert not interrupted()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_the_main_thread_cancels_the_plays_other_threads_run() -> None:
    """Only the main thread gets Ctrl-C: a tune campaign's hosts deploy from their own threads,
    and their plays stop when it calls cancel_plays. A play started afterwards (a rollback) runs."""
    import threading

    seen: dict[str, bool] = {}
    started, cancelled = threading.Event(), threading.Event()

    def host() -> None:
        with runner._interrupts() as interrupted:
            seen["before"] = interrupted()
            started.set()
            cancelled.wait(5)
            seen["after"] = interrupted()
        with runner._interrupts() as interrupted:
            seen["next play"] = interrupted()

    t = threading.Thread(target=host)
    t.start()
    started.wait(5)
    runner.cancel_plays()
    cancelled.set()
    t.join(5)
    assert seen == {"before": False, "after": True, "next play": False}


def test_the_plan_of_many_hosts_reaches_the_play_through_a_private_file(tmp_path, monkeypatch) -> None:
    """A HostPlan per host for 100 hosts is ~300 KB of JSON: one argument over 128 KiB would not
    even start (E2BIG), and on argv every local user could read it."""
    from orchestrator.hosts.playvars import HostPlan, PlayVars, UnitFacts

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "count.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        '        msg: "{{ orch.hosts | length }} {{ orch.hosts[inventory_hostname].profile }}"\n'
    )
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", books)
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n" + "".join(f"    h{i}: {{ansible_connection: local}}\n" for i in range(100))
    )
    facts = UnitFacts(profile="p", port=30000, bind="127.0.0.1", gpus=[0], health_url="http://x/health")
    unit = "# " + "x" * 3000 + "\n"
    hosts = {
        f"h{i}": HostPlan(unit_name="s.service", profile=f"p{i}", unit=unit, digest="d", facts=facts)
        for i in range(100)
    }
    play = runner.run_playbook("count.yml", inv, PlayVars(hosts=hosts), limit="h7")
    assert play.hosts["h7"].result_of("ansible.builtin.debug")["msg"] == "100 p7"
    command = next(play.artifacts.glob("command"), None) or next(play.artifacts.parent.glob("*/command"))
    argv = json.loads(command.read_text())["command"]
    assert max(len(a) for a in argv) < 1000 and not any("p7" in a for a in argv)
    vars_file = next(Path(tmp_path / "state" / "runs").glob("*/orch.json"))
    assert vars_file.stat().st_mode & 0o777 == 0o600


def test_forks_given_to_a_play_win_over_ansible_cfg(tmp_path, monkeypatch) -> None:
    """deploy --forks N reaches ansible-playbook's own --forks, above a team's ansible.cfg `forks`;
    without it the play keeps ansible.cfg's."""
    from orchestrator.hosts.playvars import PlayVars

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nforks = 7\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "forks.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        '    - ansible.builtin.debug:\n        msg: "{{ ansible_forks }}"\n'
    )
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", books)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    h1: {ansible_connection: local}\n")
    for forks, seen in ((None, 7), (3, 3)):
        play = runner.run_playbook("forks.yml", inv, PlayVars(), forks=forks)
        assert play.hosts["h1"].result_of("ansible.builtin.debug")["msg"] == seen


def test_pruning_old_runs_survives_another_thread_removing_them(tmp_path, monkeypatch) -> None:
    """Plays end at once in a tune campaign's host threads; each prunes the old runs."""
    for i in range(runner.KEEP_RUNS + 5):
        (tmp_path / f"run{i}").mkdir()
        os.utime(tmp_path / f"run{i}", (i, i))  # all old
    real = Path.stat
    gone = tmp_path / "run0"

    def stat(self, *a, **kw):
        if self == gone and os.path.isdir(gone):
            shutil.rmtree(gone)  # removed by another thread between the listing and this look
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "stat", stat)
    runner._prune_runs(tmp_path)
    assert len(list(tmp_path.iterdir())) == runner.KEEP_RUNS
