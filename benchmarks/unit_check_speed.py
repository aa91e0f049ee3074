"""What systemd_check (`systemd-analyze verify` of the planned unit, on the control machine) adds
to validate, render and deploy: its own time per unit, and `render` as a user runs it.

Prints numbers; asserts nothing.
Usage: python3 benchmarks/unit_check_speed.py [--repeat N] [--profile NAME]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

from _timing import timed

from orchestrator.profile import model as profile_mod
from orchestrator.render import launch, systemd_check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--profile", default="cg_5tok")
    args = parser.parse_args()
    if shutil.which("systemd-analyze") is None:
        sys.exit("systemd-analyze is not installed here: nothing to measure")
    prof = profile_mod.load(args.profile)
    systemd_check.check(prof, [launch.build(prof)])  # module_utils loaded once, as in a command
    build, check = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        p = launch.build(prof)
        built = time.perf_counter()
        assert systemd_check.check(prof, [p]).problems == []
        build.append(built - start)
        check.append(time.perf_counter() - built)
    render = [sys.executable, "-m", "orchestrator", "render", "-p", args.profile]
    with_check = [timed(render) for _ in range(args.repeat)]
    folders = os.environ["PATH"].split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join(d for d in folders if not os.path.exists(f"{d}/systemd-analyze"))
    without = [timed(render) for _ in range(args.repeat)]
    print(f"profile {args.profile}, median of {args.repeat} runs")
    print(f"  launch.build            {statistics.median(build) * 1000:6.1f} ms")
    print(f"  systemd_check, 1 unit   {statistics.median(check) * 1000:6.1f} ms")
    print(f"  render (whole command)  {statistics.median(with_check):6.2f} s with the check")
    print(f"  render, no systemd-analyze on PATH  {statistics.median(without):6.2f} s")


if __name__ == "__main__":
    main()
