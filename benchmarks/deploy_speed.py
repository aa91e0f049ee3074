"""Deploy speed on the lab, printed as numbers (never asserted):

- no-op redeploy on one host, against `ansible -m ping` to the same host in the same run
  (goal: at most 1.3x ping);
- restart overhead: command start to healthy, minus the stand-in's own load delay and
  warm-up (goal: at most 3x ping);
- the per-task timeline of the last restart's play, from ansible-runner's events: which
  module ran, and how long each took.

It also replays the no-op's own ansible-playbook command (argv, cwd and environment from the
run's artifacts) without orchestrator around it: the share of the no-op that is Ansible's.

Usage: python3 benchmarks/deploy_speed.py [--repeat N] [--profile NAME|PATH] [--podman|--docker] [--host N]
Needs the lab (brought up if it is not; `--podman` for a runtime.kind podman profile, `--docker`
for a docker one: a lab built with `lab up --podman` (`--docker`) also runs the host runtime, so
both compare on one lab).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _timing import timed

from orchestrator.hosts.runner import ansible_command, own_name
from orchestrator.lab import nspawn
from orchestrator.paths import state_dir


def standin_delay(host: nspawn.LabHost) -> float:
    """The stand-in's own start-up time for the reference model: load delay plus warm-up."""
    raw = subprocess.run(
        nspawn.ssh_argv(host.address, "cat", "/data/models/Kimi-K2.5/standin.json"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    knobs = json.loads(raw)
    return float(knobs.get("load_delay_s", 1.0)) + float(knobs.get("warmup_s", 0.5))


def newest_deploy() -> Path:
    return max((state_dir() / "runs").glob("*-deploy-*"), key=lambda p: p.stat().st_mtime)


def timeline(artifacts: Path) -> list[tuple[str, str, float]]:
    """(action, outcome, seconds) of each task a host ran, in order, from the run's job events."""
    events = [json.loads(p.read_text()) for p in artifacts.glob("job_events/*.json")]
    rows = []
    for ev in sorted(events, key=lambda e: e.get("counter", 0)):
        kind = ev.get("event", "")
        if kind.startswith("runner_on_") and kind != "runner_on_start":
            data = ev["event_data"]
            rows.append(
                (
                    own_name(str(data.get("task_action", "?"))),
                    kind.removeprefix("runner_on_"),
                    data.get("duration", 0),
                )
            )
    return rows


def replay_last_play() -> float:
    """Seconds the newest deploy's ansible-playbook takes when run again exactly as it ran."""
    newest = newest_deploy()
    command = json.loads(next(Path(newest, "artifacts").glob("*/command")).read_text())
    start = time.monotonic()
    done = subprocess.run(command["command"], cwd=command["cwd"], env=command["env"], capture_output=True)
    if done.returncode != 0:
        sys.exit(f"replaying {newest} failed ({done.returncode}): {done.stdout[-2000:]!r}")
    return time.monotonic() - start


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", default="cg_5tok")
    engines = parser.add_mutually_exclusive_group()
    engines.add_argument("--podman", action="store_true", help="a lab with podman (`lab up --podman`)")
    engines.add_argument("--docker", action="store_true", help="a lab with docker (`lab up --docker`)")
    parser.add_argument("--host", type=int, default=1, help="which lab host (1 = lab1)")
    args = parser.parse_args()

    seen = nspawn.status()  # a running lab of the same shape is reused as it is
    shape = {"hosts": len(seen.hosts), "gpus": seen.gpus, "sglang_version": seen.sglang_version}
    asked = args.podman or args.docker  # else the running lab's engine, if any
    engine = {
        "podman": args.podman or (seen.podman and not asked),
        "docker": args.docker or (seen.docker and not asked),
    }
    state = nspawn.up(**(shape if seen.healthy else {}), **engine)
    host = state.hosts[args.host - 1]
    inv = str(state.inventory)
    deploy = [sys.executable, "-m", "orchestrator", "deploy", "-i", inv, "--limit", host.name, "--json"]
    deploy += ["--profile", args.profile]
    timed(deploy)  # bring the host to the profile first

    # The same `ansible` orchestrator's runner would pick (beside this Python; no PATH shim).
    ping = [ansible_command("ansible"), host.name, "-i", inv, "-m", "ansible.builtin.ping"]
    pings, noops, plays, fulls = [], [], [], []
    for _ in range(args.repeat):
        pings.append(timed(ping))
        noops.append(timed(deploy))
        plays.append(replay_last_play())
        fulls.append(timed([*deploy, "--force-restart"]))
    last = subprocess.run([*deploy, "--force-restart"], capture_output=True, text=True, check=True)
    tasks = timeline(Path(json.loads(last.stdout)["artifacts"]))
    delay = standin_delay(host)
    ping_s, noop_s, play_s, full_s = (statistics.median(x) for x in (pings, noops, plays, fulls))

    print(f"host {host.name}, profile {args.profile}, median of {args.repeat} runs each")
    print(f"{'ansible -m ping':<40} {ping_s:6.2f} s")
    print(f"{'no-op deploy':<40} {noop_s:6.2f} s   {noop_s / ping_s:4.2f}x ping (goal <= 1.3x)")
    print(f"{'  its ansible-playbook alone':<40} {play_s:6.2f} s   {play_s / ping_s:4.2f}x ping")
    print(f"{'deploy with restart (to healthy)':<40} {full_s:6.2f} s")
    print(f"{'  stand-in load delay + warm-up':<40} {delay:6.2f} s")
    over = full_s - delay
    print(f"{'  restart overhead':<40} {over:6.2f} s   {over / ping_s:4.2f}x ping (goal <= 3x)")
    in_tasks = sum(t[2] for t in tasks)
    print(f"per-task timeline of the last restart ({len(tasks)} tasks, {in_tasks:.2f} s in tasks):")
    for action, outcome, took in tasks:
        print(f"  {action:<44} {outcome:<8} {took:6.2f} s")


if __name__ == "__main__":
    main()
