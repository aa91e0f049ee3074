"""No-op and full deploys on 1, 2, 4 and 6 lab hosts, printed as a table (asserts nothing).

Goal: the no-op on 6 hosts takes at most 1.5x the no-op on one host. Ansible does the fan-out
(forks, linear strategy, pipelining, SSH ControlPersist; see orchestrator/runner.py).
Needs a lab of 6 hosts: this script runs `lab down` + `lab up --hosts 6` when the lab differs,
and leaves the 6-host lab up.
Usage: python3 benchmarks/fleet_speed.py [--repeat N] [--profile NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _timing import timed

from orchestrator.lab import hosts as lab_hosts

SIZES = (1, 2, 4, 6)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="cg_5tok")
    args = parser.parse_args()
    seen = lab_hosts.status()
    if seen.exists and len(seen.hosts) != max(SIZES):
        lab_hosts.down()
    state = lab_hosts.up(hosts=max(SIZES))
    names = [h.name for h in state.hosts]
    base = [
        sys.executable,
        "-m",
        "orchestrator",
        "deploy",
        "-i",
        str(state.inventory),
        "-p",
        args.profile,
        "--json",
    ]
    timed([*base, "--limit", ",".join(names)])  # every host on the profile first
    print(f"profile {args.profile}, median of {args.repeat} runs, whole command")
    print(f"{'hosts':>5}  {'no-op':>8}  {'full':>8}  {'no-op vs 1 host':>16}")
    first = None
    for n in SIZES:
        limit = ["--limit", ",".join(names[:n])]
        noop = statistics.median(timed([*base, *limit]) for _ in range(args.repeat))
        full = statistics.median(timed([*base, *limit, "--force-restart"]) for _ in range(args.repeat))
        first = first or noop
        print(f"{n:>5}  {noop:7.2f}s  {full:7.2f}s  {noop / first:15.2f}x")
    print("goal: no-op on 6 hosts <= 1.5x the no-op on 1 host")


if __name__ == "__main__":
    main()
