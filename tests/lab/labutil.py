"""Helpers for lab tests: the CLI as a user runs it, and ssh reads of what hosts really run."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from orchestrator.lab import nspawn

#: What the session learnt: owns_lab, the `lab` fixture started the lab and takes it down at the
#: end; wants_podman, wants_docker, podman (docker) tests were collected; docker_base, the future
#: of the docker lab's base root being built (conftest.docker_base).
SESSION: dict[str, Any] = {
    "owns_lab": False,
    "wants_podman": False,
    "wants_docker": False,
    "docker_base": None,
}

UNIT = "/etc/systemd/system/sglang.service"
#: The known good profile that failure and preflight tests start from (and roll back to).
GOOD = "cg_5tok"


def orchestrator(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI exactly as a user runs it (on another control machine: `env`, from control())."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def control(state: Path, ledger: str | None = None) -> dict[str, str]:
    """The environment of another control machine: its own state directory `state`, recording in
    `ledger` (a team's PostgreSQL URL; None: the SQLite file in `state`). The lab's inventory names
    its keys and known hosts by absolute paths, so `-i lab.inventory` reaches the hosts from it."""
    env = {k: v for k, v in os.environ.items() if k != "ORCHESTRATOR_LEDGER"}
    env["ORCHESTRATOR_STATE_DIR"] = str(state)
    if ledger:
        env["ORCHESTRATOR_LEDGER"] = ledger
    return env


def deploy_json(lab, *args: str) -> tuple[int, dict]:
    done = orchestrator("deploy", "-i", str(lab.inventory), "--json", *args)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}") from None


def ssh(host, *command: str) -> str:
    """Run a command on a lab host: one string is a shell line, several are an argv (quoted for it)."""
    line = command[0] if len(command) == 1 else shlex.join(command)
    done = subprocess.run(nspawn.ssh_argv(host.address, line), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


def service(host) -> dict[str, str]:
    out = ssh(
        host, "systemctl", "show", "sglang.service", "--property=ActiveState,MainPID,ExecMainStartTimestamp"
    )
    return dict(line.split("=", 1) for line in out.splitlines())


def cmdline(host, pid: str) -> list[str]:
    raw = subprocess.run(
        nspawn.ssh_argv(host.address, "cat", f"/proc/{pid}/cmdline"), capture_output=True, timeout=30
    ).stdout
    return [a.decode() for a in raw.split(b"\0")[:-1]]


def write_profile(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yml"
    path.write_text(text)
    return str(path)


def variant(tmp_path: Path, name: str, **sections) -> str:
    """A profile file extending GOOD with `sections` changed."""
    return write_profile(tmp_path, name, yaml.safe_dump({"extends": GOOD, **sections}))


def on_good(lab):
    """The lab's first host, deployed healthy on GOOD."""
    h = lab.hosts[0]
    rc, report = deploy_json(lab, "--profile", GOOD, "--limit", h.name)
    assert rc == 0, report
    return h


def service_pid(host, unit: str, timeout_s: float = 5, not_pid: str = "0") -> str:
    """The unit's MainPID once it has one (other than `not_pid`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = ssh(host, "systemctl", "show", unit, "--property=MainPID", "--value").strip()
        if pid not in ("0", not_pid):
            return pid
        time.sleep(0.1)
    raise AssertionError(f"{unit} did not start")


@contextmanager
def gpu_count(host, count: int) -> Iterator[None]:
    """The host's nvidia-smi stand-in reports `count` GPUs for the duration."""
    config = json.loads(ssh(host, "cat", "/etc/nvidia-standin.json"))

    def write(data: dict) -> None:
        line = f"open('/etc/nvidia-standin.json','w').write({json.dumps(json.dumps(data))})"
        ssh(host, "python3", "-c", line)

    write({**config, "gpus": count})
    try:
        yield
    finally:
        write(config)


def docker_base() -> concurrent.futures.Future:
    """The docker lab's base root (`ensure_base(docker=True)`, a minute's debootstrap on a fresh
    machine), built beside the tests that run before the docker ones when they are collected; the
    docker lab's fixture waits for it (one build: a second would remove the first's folder)."""
    if SESSION["docker_base"] is None:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def build() -> None:
            try:
                future.set_result(nspawn.ensure_base(docker=True))
            except BaseException as err:  # handed to whoever waits for it
                future.set_exception(err)

        # A daemon thread: a session that ends first (a -x failure) does not wait for debootstrap.
        threading.Thread(target=build, name="docker-base", daemon=True).start()
        SESSION["docker_base"] = future
    return SESSION["docker_base"]
