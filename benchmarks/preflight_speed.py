"""Preflight runs on all hosts in parallel (Ansible forks): its time on 3 lab hosts against 1.

Goal: 3 hosts take at most 1.3x the time of 1. Prints numbers; asserts nothing.
Usage: python3 benchmarks/preflight_speed.py [--repeat N] [--profile NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _timing import timed

from orchestrator.lab import nspawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", default="cg_5tok")
    args = parser.parse_args()
    state = nspawn.up()
    names = [h.name for h in state.hosts]
    base = [sys.executable, "-m", "orchestrator", "preflight", "-i", str(state.inventory), "-p", args.profile]
    one = [timed([*base, "--limit", names[0]]) for _ in range(args.repeat)]
    every = [timed([*base, "--limit", ",".join(names)]) for _ in range(args.repeat)]
    t1, tn = statistics.median(one), statistics.median(every)
    print(f"preflight, profile {args.profile}, median of {args.repeat} runs (whole command)")
    print(f"  1 host   {t1:5.2f} s")
    print(f"  {len(names)} hosts  {tn:5.2f} s   {tn / t1:4.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
