"""logs on real journals over real Ansible: host prefixes, time order, --lines, --since, literal text,
an unreachable host, and --follow ended by Ctrl-C. Only lab3 is deployed to or given new units."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO

import pytest
import yaml

from orchestrator.hosts import logs_play
from orchestrator.lab import nspawn

pytestmark = pytest.mark.lab

HOST = "lab3"
READY = "The server is fired up and ready to roll!"
LINE = re.compile(r"^(\S+)\s+(\d\d:\d\d:\d\d\.\d{3}) \| (.*)$")
# The command object, run as a user would once it is registered in cli/main.py as `logs`.
LOGS = [
    sys.executable,
    "-c",
    "from orchestrator.cli.logs_command import logs; logs(prog_name='orchestrator logs')",
]


def run_logs(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOGS, "-i", str(inventory), *args], capture_output=True, text=True, timeout=120)


def parsed(stdout: str) -> list[tuple[str, str, str]]:
    """(host, HH:MM:SS.mmm, message) per printed line; every line must have the shape."""
    rows = [LINE.match(raw) for raw in stdout.splitlines()]
    assert all(rows), stdout
    return [m.groups() for m in rows if m]


def lab3(lab) -> nspawn.LabHost:
    return next(h for h in lab.hosts if h.name == HOST)


def run_unit_on_lab3(lab, unit: str, *argv: str) -> None:
    """A transient unit on lab3 whose output lands in the journal under `unit`, as a server's does."""
    remote = ["systemd-run", f"--unit={unit}", "--wait", "--quiet", *argv]
    done = subprocess.run(
        nspawn.ssh_argv(lab3(lab).address, *map(shlex.quote, remote)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def deployed(lab) -> Path:
    """A fresh start of the server on lab3, so its startup lines are among the last 40."""
    args = ["deploy", "-p", "cg_5tok", "-i", str(lab.inventory), "--limit", HOST, "--force-restart", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return lab.inventory


def test_ready_line_is_shown_prefixed_by_its_host(deployed):
    done = run_logs(deployed, "--limit", HOST)
    assert done.returncode == 0, done.stderr
    rows = parsed(done.stdout)
    assert {host for host, _, _ in rows} == {HOST}
    assert any(READY in message for _, _, message in rows), done.stdout


def test_printed_lines_are_in_time_order(deployed):
    done = run_logs(deployed, "--limit", HOST, "--lines", "100")
    stamps = [stamp for _, stamp, _ in parsed(done.stdout)]
    assert len(stamps) > 10 and stamps == sorted(stamps)


def test_hosts_are_merged_in_time_order(lab):
    """Reading any host is allowed: every lab host's sshd journal, merged."""
    batch = logs_play.read(lab.inventory, unit_name="ssh.service", lines=30)
    assert batch.hosts == sorted(h.name for h in lab.hosts) and not batch.failures
    assert len({line.host for line in batch.lines}) > 1
    assert [line.time for line in batch.lines] == sorted(line.time for line in batch.lines)


def test_lines_caps_each_host(deployed):
    done = run_logs(deployed, "--limit", HOST, "--lines", "5")
    assert done.returncode == 0, done.stderr
    assert len(parsed(done.stdout)) == 5


def test_since_in_the_future_gives_nothing(deployed):
    done = run_logs(deployed, "--limit", HOST, "--since", "2099-01-01 00:00")
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_markup_and_non_utf8_bytes_print_literally(lab):
    unit = f"orch-logs-test-{uuid.uuid4().hex[:8]}"
    run_unit_on_lab3(lab, unit, "/usr/bin/printf", r"[red]not red[/red] [bold] :smile: \377 end\n")
    done = run_logs(lab.inventory, "--limit", HOST, "--unit", f"{unit}.service")
    assert done.returncode == 0, done.stderr
    messages = [message for _, _, message in parsed(done.stdout)]
    assert "[red]not red[/red] [bold] :smile: \ufffd end" in messages, done.stdout


def test_unreachable_host_is_reported_and_the_others_still_print(lab, tmp_path):
    spec = yaml.safe_load(lab.inventory.read_text())["all"]["children"]["lab"]["hosts"][HOST]
    ghost = {**spec, "ansible_host": "10.213.0.250"}
    ghost["ansible_ssh_common_args"] += " -o ConnectTimeout=3"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {HOST: spec, "ghost": ghost}}}))
    done = run_logs(inventory, "--lines", "3")
    assert done.returncode == 1
    assert re.search(r"^ghost: unreachable: ", done.stderr, re.M), done.stderr
    assert [host for host, _, _ in parsed(done.stdout)] == [HOST] * 3


class Lines:
    """A child's output stream collected line by line, so the test can wait for one with a deadline."""

    def __init__(self, stream: IO[str] | None):
        self.lines: list[str] = []
        assert stream is not None
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline, f"{text!r} not printed; got {self.lines}"
            time.sleep(0.2)


def test_follow_prints_each_new_line_once_and_ctrl_c_exits_0(lab):
    unit = f"orch-logs-follow-{uuid.uuid4().hex[:8]}"
    run_unit_on_lab3(lab, unit, "/bin/echo", "before")  # history that -n 0 must not show
    argv = [*LOGS, "-i", str(lab.inventory), "--limit", HOST, "--unit", f"{unit}.service", "-f", "-n", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        err.wait_for("following 1 host(s); Ctrl-C stops")
        run_unit_on_lab3(lab, unit, "/bin/echo", "first")
        out.wait_for("first")
        run_unit_on_lab3(lab, unit, "/bin/echo", "second")
        out.wait_for("second")
        time.sleep(2.5)  # more rounds after the cursor: nothing may repeat
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, err.lines
    finally:
        proc.kill()
    messages = [m for _, _, m in parsed("".join(out.lines))]
    assert messages.count("first") == 1 and messages.count("second") == 1, messages
    assert "before" not in messages, messages
