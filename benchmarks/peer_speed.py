"""What deploy's safety costs, against the playbook a team would otherwise write (printed, never asserted).

Side by side in one run, interleaved, medians of --repeat runs, one lab host, the same unit:

- floor: one ssh that runs `systemctl restart` and polls /health with curl on the host;
- the plain playbook (benchmarks/peer/plain.yml: copy the unit, `systemd_service`, `uri` until
  /health answers, once a second), restarting, and re-run with nothing to change;
- `orchestrator deploy --force-restart` and the no-op `orchestrator deploy`, with the lock,
  preflight, the GPUs-idle check, the start-up wait, the record and rollback.

The plain playbook runs with the Ansible settings of orchestrator's own play (its environment,
read from the run's artifacts: pipelining, SSH ControlPersist, forks), so the difference is the
work, not the configuration. Goals (issue 26): restart at most 1.0x the plain playbook, no-op at
most 0.6x. Then the per-task timeline of the last restart, from ansible-runner's events.

With --mitogen, both run under Mitogen for Ansible's strategy (mitogen_linear, from the installed
`mitogen` package), as a team's ansible.cfg asking for it would run them: orchestrator from a
directory whose ansible.cfg says so, the plain playbook with the same settings.

Usage: python3 benchmarks/peer_speed.py [--repeat N] [--profile NAME|PATH] [--host N] [--mitogen]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import timed as run
from deploy_speed import newest_deploy, timeline

from orchestrator.hosts.runner import ansible_command, own_name
from orchestrator.lab import nspawn

PLAIN = Path(__file__).parent / "peer" / "plain.yml"


def rendered(profile: str) -> tuple[str, str, int]:
    """(unit file name, unit text, server port) of the profile, as `orchestrator render` lays it out."""
    raw = subprocess.run(
        [sys.executable, "-m", "orchestrator", "render", "--profile", profile, "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out = json.loads(raw)
    argv = out["argv"]
    port = int(argv[argv.index("--port") + 1])
    name = next(
        line.split("=", 1)[1] for line in out["unit"].splitlines() if line.startswith("SyslogIdentifier=")
    )
    return f"{name}.service", out["unit"], port


def restart_steps(artifacts: Path) -> list[tuple[str, float]]:
    """(module, seconds) of each step the restart's one transaction ran on the host (sglang_restart)."""
    for path in artifacts.glob("job_events/*.json"):
        data = json.loads(path.read_text()).get("event_data", {})
        action = own_name(str(data.get("task_action", "")))
        if action == "sglang_restart" and "steps" in (data.get("res") or {}):
            return [(s["action"], s["took_s"]) for s in data["res"]["steps"]]
    return []


def play_env() -> dict[str, str]:
    """The environment orchestrator's newest deploy ran ansible-playbook with (its Ansible settings)."""
    command = json.loads(next(Path(newest_deploy(), "artifacts").glob("*/command")).read_text())
    return dict(command["env"])


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", default="cg_5tok")
    parser.add_argument("--host", type=int, default=2, help="which lab host (2 = lab2)")
    parser.add_argument("--mitogen", action="store_true", help="both under Mitogen's mitogen_linear")
    args = parser.parse_args()
    where = tempfile.TemporaryDirectory()
    if args.mitogen:
        import ansible_mitogen

        strategies = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
        text = f"[defaults]\nstrategy = mitogen_linear\nstrategy_plugins = {strategies}\n"
        Path(where.name, "ansible.cfg").write_text(text)
        if "/" not in args.profile and not args.profile.endswith(".yml"):
            args.profile = str(Path("profiles", f"{args.profile}.yml").resolve())

    seen = nspawn.status()  # a running lab of the same shape is reused as it is
    shape = {"hosts": len(seen.hosts), "gpus": seen.gpus, "sglang_version": seen.sglang_version}
    state = nspawn.up(**(shape if seen.healthy else {}), podman=seen.podman)
    host = state.hosts[args.host - 1]
    inv = str(state.inventory)
    deploy = [sys.executable, "-m", "orchestrator", "deploy", "-i", inv, "--limit", host.name, "--json"]
    deploy += ["--profile", args.profile]
    cwd = where.name if args.mitogen else None
    run(deploy, cwd=cwd)  # the host runs the profile, recorded: the starting point of every row
    unit_name, unit, port = rendered(args.profile)
    health = f"http://127.0.0.1:{port}/health"
    env = play_env()

    with tempfile.TemporaryDirectory() as tmp:
        unit_src = Path(tmp, unit_name)
        unit_src.write_text(unit)
        plain = [ansible_command("ansible-playbook"), "-i", inv, "--limit", host.name, str(PLAIN)]
        plain += ["-e", f"unit_name={unit_name} unit_src={unit_src} health_url={health}"]
        poll = f"until curl -sf -o /dev/null {health}; do sleep 0.1; done"
        floor = nspawn.ssh_argv(host.address, f"systemctl restart {unit_name} && {poll}")
        rows: dict[str, list[float]] = {k: [] for k in ("floor", "plain", "ours", "plain_noop", "ours_noop")}
        for _ in range(args.repeat):
            rows["floor"].append(run(floor))
            rows["plain"].append(run([*plain, "-e", "state=restarted"], env))
            rows["ours"].append(run([*deploy, "--force-restart"], cwd=cwd))
            rows["plain_noop"].append(run([*plain, "-e", "state=started"], env))
            rows["ours_noop"].append(run(deploy, cwd=cwd))
    last = subprocess.run([*deploy, "--force-restart"], capture_output=True, text=True, check=True, cwd=cwd)
    artifacts = Path(json.loads(last.stdout)["artifacts"])
    tasks, steps = timeline(artifacts), restart_steps(artifacts)
    med = {k: statistics.median(v) for k, v in rows.items()}

    under = ", both under Mitogen (mitogen_linear)" if args.mitogen else ""
    print(f"host {host.name}, profile {args.profile}, medians of {args.repeat} interleaved runs{under}")
    print(f"{'floor: ssh, systemctl restart, poll /health':<48} {med['floor']:6.2f} s")
    print(f"{'plain playbook, restart':<48} {med['plain']:6.2f} s")
    ratio = med["ours"] / med["plain"]
    ours = "orchestrator deploy --force-restart"
    print(f"{ours:<48} {med['ours']:6.2f} s   {ratio:4.2f}x plain (goal <= 1.0x)")
    print(f"{'plain playbook, nothing to change':<48} {med['plain_noop']:6.2f} s")
    ratio = med["ours_noop"] / med["plain_noop"]
    print(
        f"{'orchestrator deploy, no-op':<48} {med['ours_noop']:6.2f} s   {ratio:4.2f}x plain (goal <= 0.6x)"
    )
    for key, values in rows.items():
        print(f"  {key:<12} " + " ".join(f"{v:5.2f}" for v in values))
    in_tasks = sum(t[2] for t in tasks)
    print(f"per-task timeline of the last restart ({len(tasks)} tasks, {in_tasks:.2f} s in tasks):")
    for action, outcome, took in tasks:
        print(f"  {action:<44} {outcome:<8} {took:6.2f} s")
        for step, step_s in steps if action == "sglang_restart" else ():
            print(f"    {step:<42} {'':<8} {step_s:6.2f} s")


if __name__ == "__main__":
    main()
