"""How long `lab up` takes: from nothing (no base root cache; goal <= 120 s) and cached (goal <= 20 s).

Runs in a throw-away state directory, so the real lab and its cache are not touched; it refuses to run
while a lab is up, since both would want the same bridge. Needs root and the network (debootstrap).

    python3 benchmarks/lab_up.py [--hosts 3] [--warm-runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from orchestrator.lab import nspawn


def timed_up(hosts: int) -> float:
    started = time.monotonic()
    nspawn.up(hosts=hosts)
    return time.monotonic() - started


def timed_down() -> float:
    started = time.monotonic()
    nspawn.down()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=nspawn.DEFAULT_HOSTS)
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()
    if nspawn.BRIDGE in os.listdir("/sys/class/net"):
        raise SystemExit(f"a lab is up ({nspawn.BRIDGE} exists): run `lab down` first")
    scratch = Path(tempfile.mkdtemp(prefix="orch-lab-bench-"))
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(scratch)
    try:
        cold = timed_up(args.hosts)
        downs = [timed_down()]
        warm = []
        for _ in range(args.warm_runs):
            warm.append(timed_up(args.hosts))
            downs.append(timed_down())
    finally:
        if nspawn.status().exists:
            nspawn.down()
        shutil.rmtree(scratch)
    rows = [
        (f"lab up --hosts {args.hosts}, no cache (debootstrap)", cold, "goal <= 120 s"),
        (f"lab up --hosts {args.hosts}, cached base root", min(warm), f"best of {len(warm)}, goal <= 20 s"),
        (f"lab up --hosts {args.hosts}, cached, worst run", max(warm), ""),
        ("lab down, worst run", max(downs), f"of {len(downs)}"),
    ]
    for label, seconds, note in rows:
        print(f"{label:<45} {seconds:6.1f} s   {note}")


if __name__ == "__main__":
    main()
