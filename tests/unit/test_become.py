"""A become (sudo) password: asked once by -K, handed to ansible-playbook only through
ansible-runner's answer to its prompt, and a failed become told in one line with its fix.

The lab shows it against real sudo (tests/lab/test_sudo.py); here: the parts on this machine.
"""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli.main import BECOME_COMMANDS, cli
from orchestrator.hosts import diagnose, runner
from orchestrator.hosts.playvars import PlayVars
from orchestrator.hosts.runner import HostRun, TaskEvent

PASSWORD = "s3cret-Become-7f2"

#: Failed results as Ansible 2.19 reports them (captured on the lab, status.yml's first task).
MISSING = {
    "exception": "(traceback unavailable)",
    "msg": "Task failed: Missing sudo password",
    "changed": False,
}
INCORRECT = {"exception": "(traceback unavailable)", "msg": "Task failed: Incorrect sudo password"}
NOT_SUDOER = {
    "msg": "Module result deserialization failed: No start of json char found",
    "module_stdout": "",
    "module_stderr": "nosudo is not in the sudoers file.\n",
    "rc": 1,
}


@pytest.fixture(autouse=True)
def _no_password_left_behind(monkeypatch):
    monkeypatch.setattr(runner, "_become_password", "")


# --- the one-line diagnoses ------------------------------------------------------------------


def test_a_missing_password_names_the_option() -> None:
    line = diagnose.become(MISSING, "deploy", password_given=False)
    assert line == "sudo as deploy asks for a password: pass -K/--ask-become-pass"


def test_a_wrong_password_says_sudo_refused_it() -> None:
    line = diagnose.become(INCORRECT, "deploy-pw", password_given=True)
    assert line == "sudo refused the become password for deploy-pw: give -K that user's own password"


def test_a_user_sudo_does_not_know_may_not_sudo() -> None:
    line = diagnose.become(NOT_SUDOER, "nosudo", password_given=True)
    assert line is not None and line.startswith("nosudo may not sudo on this host (not in sudoers)")


def test_other_failures_are_not_become_failures() -> None:
    assert diagnose.become({"msg": "GPU 3 is used by PID 1234"}, "deploy", False) is None
    # a command whose own output mentions sudoers ran: the module printed its result
    ran = {"module_stdout": '{"rc": 1}', "module_stderr": "x is not in the sudoers file", "msg": "x"}
    assert diagnose.become(ran, "deploy", False) is None
    assert diagnose.become(MISSING, "", False) == (
        "sudo as the login user asks for a password: pass -K/--ask-become-pass"
    )


def test_a_failed_become_becomes_the_hosts_message_naming_the_inventorys_user(tmp_path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars: {ansible_become: true}\n  hosts:\n    h1: {ansible_user: deploy-pw}\n    h2: {}\n"
    )
    hosts = {}
    for name, result in (("h1", MISSING), ("h2", INCORRECT)):
        hosts[name] = HostRun(name, events=[TaskEvent(name, "failed", "r", "sglang_probe", dict(result))])
    ok = HostRun("h3", events=[TaskEvent("h3", "failed", "r", "sglang_probe", {"msg": "other"})])
    runner._explain_become({**hosts, "h3": ok}, inv, password_given=False)
    h1 = hosts["h1"].failed
    assert (
        h1 is not None
        and h1.result["msg"] == "sudo as deploy-pw asks for a password: pass -K/--ask-become-pass"
    )
    assert h1.result["ansible_msg"] == "Task failed: Missing sudo password"
    h2 = hosts["h2"].failed
    assert h2 is not None and h2.result["msg"].startswith(
        "sudo refused the become password for the login user"
    )
    assert ok.events[0].result == {"msg": "other"}


# --- the password's way into the play -------------------------------------------------------


def test_the_password_answers_the_prompt_and_is_kept_nowhere(tmp_path, monkeypatch) -> None:
    """A real ansible-playbook with --ask-become-pass waits at its prompt until it is answered:
    the play finishing is the proof the answer came, and no file of the run holds it."""
    state = tmp_path / "state"
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "debug.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug: {msg: hi}\n"
    )
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", books)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    h1: {ansible_connection: local}\n")
    runner.use_become_password(PASSWORD)
    play = runner.run_playbook("debug.yml", inv, PlayVars())
    assert play.rc == 0 and play.hosts["h1"].result_of("ansible.builtin.debug") is not None
    command = json.loads(next(play.artifacts.parent.glob("*/command")).read_text())
    assert "--ask-become-pass" in command["command"]
    for path in state.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    assert not list(state.rglob("passwords"))  # ansible-runner's env/passwords


# --- the command line -----------------------------------------------------------------------


def _help(name: str) -> str:
    ctx = click.Context(cli)
    command = cli.get_command(ctx, name)
    assert command is not None
    return command.get_help(click.Context(command, info_name=name))


@pytest.mark.parametrize("name", sorted(BECOME_COMMANDS))
def test_every_command_that_plays_against_hosts_takes_k(name: str) -> None:
    assert "-K, --ask-become-pass" in _help(name)


@pytest.mark.parametrize("name", ["render", "validate", "profiles", "history", "results", "schema"])
def test_commands_that_reach_no_host_do_not(name: str) -> None:
    assert "--ask-become-pass" not in _help(name)


def test_k_asks_once_and_every_play_of_the_command_gets_it(monkeypatch, tmp_path) -> None:
    from orchestrator.hosts import status_play

    asked, seen = [], []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or PASSWORD)

    def fake_status(*args, **kwargs):
        seen.append(runner._become_password)
        return []

    monkeypatch.setattr(status_play, "status", fake_status)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    h1: {ansible_connection: local}\n")
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    done = CliRunner().invoke(cli, ["status", "-K", "-i", str(inv)])
    assert done.exit_code == 0, done.output
    assert asked == ["BECOME password: "] and seen == [PASSWORD]
    assert PASSWORD not in done.output


def test_an_empty_password_is_refused(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("getpass.getpass", lambda prompt: "")
    done = CliRunner().invoke(cli, ["stop", "-K", "-i", str(tmp_path)])
    assert done.exit_code == 2 and "the become password is empty" in done.output
    assert runner._become_password == ""


def test_verify_refuses_k_before_asking(monkeypatch) -> None:
    monkeypatch.setattr("getpass.getpass", lambda prompt: pytest.fail("asked for a password"))
    done = CliRunner().invoke(cli, ["verify", "-K"])
    assert done.exit_code == 2
    assert "verify cannot use a become password" in done.output and "NOPASSWD" in done.output
