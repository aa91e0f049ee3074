"""No-op and full deploys on 1, 2, 4, 8 and 16 lab hosts: wall time and the control side's own CPU,
printed as a table, with a projection to 100 and 500 hosts (asserts nothing).

Goal: the no-op on 16 hosts takes at most 1.5x the no-op on one host, and a 500-host rollout is
bound by its hosts (their restarts), not by the control machine. Ansible does the fan-out (forks,
the orchestrator_linear strategy, pipelining, SSH ControlPersist; see orchestrator/hosts/ansible_config.py).

Measured before (issue #16): a no-op took 7.4 s on 16 hosts against 2.8 s on one, a restart of 16
took 66 s against 12 s. The lab hosts share the control machine's cores, so wall times do not
isolate the control side. Its CPU seconds do:

- control CPU: user + system seconds of the deploy command's whole process tree as the tree reaps
  it (os.wait4): orchestrator's Python, ansible-playbook, its forked workers, the ssh clients; plus
  the ssh ControlPersist masters the tree leaves running (they daemonise, so no process of the tree
  reaps them: this script makes itself their parent with PR_SET_CHILD_SUBREAPER and reads their CPU
  in /proc before and after each run). The lab hosts' processes (containers, sshd, the stand-in
  servers) are not under the command and are not counted.
- 1-core floor: the own CPU (children not included) of orchestrator's process and of ansible-playbook's,
  read in /proc every 0.1 s while the command runs. Each runs on one core however many there are.

The projection fits control CPU per deploy = a + b x hosts (least squares over the measured sizes)
and prints its formula with the numbers in it: a projection, not a measurement.

Each point is the median of --repeat runs: 2 by default, so that the run up to 16 hosts stays
within about 15 minutes. Every deploy gets --forks (default 50), so no size is capped at Ansible's
20. Needs a lab of max(--sizes) hosts: this script runs `lab down` + `lab up --hosts N` when the lab
differs, and leaves it up. The deploys run this checkout's orchestrator (PYTHONPATH), whatever
package is installed.
Usage: PYTHONPATH=. python3 benchmarks/fleet_speed.py [--sizes 1,2,4,8,16] [--max-hosts N]
       [--repeat N] [--forks N] [--profile NAME] [--control-cores C] [--serial N|P%]
       [--restart-s S] [--project 100,500] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import re
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from _timing import timed_cpu

from orchestrator.lab import nspawn

SIZES = (1, 2, 4, 8, 16)
PROJECT = (100, 500)
#: The most Ansible workers a control core is given in a recommended forks setting.
FORKS_PER_CORE = 25
CHECKOUT = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
TICKS = os.sysconf("SC_CLK_TCK")
FORMULA = """\
  control CPU s  = a + b x N                   least squares over the measured sizes
  batch B        = --serial of N hosts         a percentage rounds down, at least 1 (as Ansible's)
  batches        = ceil(N / B)
  forks F        = {forks_rule:<28}a whole batch at once, at most {per_core} workers a core
  CPU-bound s    = control CPU s / min(C, F)
  1-core floor s = a' + b' x N                 the busier of orchestrator's and ansible-playbook's own CPU
  host-bound s   = batches x ceil(B / F) x t1  t1: one host's deploy, measured at {t1_hosts} host(s)
  wall s         = the largest of the three"""


# ---------------------------------------------------------------- projection (pure)


@dataclass(frozen=True)
class Line:
    """seconds = a + b x hosts."""

    a: float
    b: float

    def at(self, hosts: float) -> float:
        return self.a + self.b * hosts


def fit_line(points: Sequence[tuple[float, float]]) -> Line:
    """Least squares through (hosts, seconds); needs points at two host counts at least."""
    if len({x for x, _ in points}) < 2:
        raise ValueError("a line needs points at two host counts at least")
    slope, intercept = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return Line(intercept, slope)


def batch_size(serial: str, hosts: int) -> int:
    """Hosts per batch for --serial N or P% of `hosts`, counted as Ansible counts it."""
    if serial.endswith("%"):
        return max(1, int(float(serial[:-1]) / 100 * hosts))
    return max(1, min(int(serial), hosts))


def recommended_forks(batch: int, cores: int) -> int:
    """Forks enough for a whole batch at once, at most FORKS_PER_CORE workers a control core."""
    return max(1, min(batch, cores * FORKS_PER_CORE))


@dataclass(frozen=True)
class Projection:
    kind: str
    hosts: int
    serial: str
    batch: int
    batches: int
    forks: int
    cpu_s: float
    cpu_bound_s: float
    floor_s: float | None
    host_bound_s: float
    wall_s: float
    bound: str


def project(
    kind: str, hosts: int, serial: str, cores: int, cpu: Line, floor: Line | None, per_batch_s: float
) -> Projection:
    """A rollout of `hosts` in batches of --serial on `cores` control cores (see FORMULA)."""
    batch = batch_size(serial, hosts)
    forks = recommended_forks(batch, cores)
    batches = math.ceil(hosts / batch)
    cpu_s = cpu.at(hosts)
    bounds = {
        "control CPU": cpu_s / min(cores, forks),
        "1-core floor": floor.at(hosts) if floor else 0.0,
        "hosts": batches * math.ceil(batch / forks) * per_batch_s,
    }
    bound = max(bounds, key=lambda name: bounds[name])
    return Projection(
        kind,
        hosts,
        serial,
        batch,
        batches,
        forks,
        cpu_s,
        bounds["control CPU"],
        floor.at(hosts) if floor else None,
        bounds["hosts"],
        bounds[bound],
        bound,
    )


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Run:
    wall_s: float
    tree_cpu_s: float
    """The deploy command's process tree as it was reaped (os.wait4)."""
    masters_cpu_s: float
    """What the tree left running, its ssh ControlPersist masters, during this run."""
    floor_s: float | None
    """The busier of orchestrator's and ansible-playbook's own CPU; None when neither was read."""

    @property
    def cpu_s(self) -> float:
        return self.tree_cpu_s + self.masters_cpu_s


def read_stat(pid: int | str) -> tuple[str, str, int, float] | None:
    """(name, state, parent pid, own CPU s) of a process, from /proc/PID/stat; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")  # the name may hold spaces and parentheses
    fields = rest.split()
    return head.partition("(")[2], fields[0], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def children(parent: int) -> Iterator[tuple[int, tuple[str, str, int, float]]]:
    """(pid, read_stat) of each child of `parent`, by a scan of /proc (this kernel may not have
    /proc/PID/task/TID/children)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := read_stat(entry.name)) and stat[2] == parent:
            yield int(entry.name), stat


def become_subreaper() -> bool:
    """Make this process the parent of what the deploys leave running (ssh masters daemonise), so
    that their CPU can be read; False where the kernel does not offer it."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class OwnCpu:
    """timed_cpu's `while_running`: the own CPU of orchestrator's process and of the ansible-playbook
    under it, as last read (at most 0.1 s before each ended). Until ansible-playbook has started, each
    call scans /proc (a few ms on the lab), in this script's process, which the CPU columns leave out."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self._playbook: int | None = None

    def __call__(self, pid: int) -> None:
        if self._playbook is None:  # one play per deploy: found once, then read alone
            self._playbook = next((p for p, _ in children(pid) if _is_playbook(p)), None)
        for name, each in (("orchestrator", pid), ("ansible-playbook", self._playbook)):
            stat = read_stat(each) if each else None
            if stat:
                self.seen[name] = stat[3]


def _is_playbook(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"ansible-playbook" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def measure(argv: list[str], env: dict[str, str], masters: set[int]) -> Run:
    """One deploy. `masters` collects the pids of the live ssh masters this script is parent of."""
    before = {pid: stat[3] for pid, stat in children(os.getpid())}
    own = OwnCpu()
    done = timed_cpu(argv, env, while_running=own)
    left = 0.0
    for pid, (name, state, _, cpu_s) in children(os.getpid()):
        left += cpu_s - before.get(pid, 0.0)
        if name == "ssh" and state != "Z":
            masters.add(pid)
        if state == "Z":  # a master that timed out, or the one daemon() forked it from
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    return Run(done.wall_s, done.cpu_s, left, max(own.seen.values(), default=None))


def summary(runs: list[Run]) -> dict[str, float | None]:
    """Medians of each measure over the repeats, and every run."""
    floors = [r.floor_s for r in runs if r.floor_s is not None]
    return {
        "wall_s": statistics.median(r.wall_s for r in runs),
        "cpu_s": statistics.median(r.cpu_s for r in runs),
        "tree_cpu_s": statistics.median(r.tree_cpu_s for r in runs),
        "masters_cpu_s": statistics.median(r.masters_cpu_s for r in runs),
        "floor_s": statistics.median(floors) if floors else None,
        "runs": [asdict(r) for r in runs],
    }


# ---------------------------------------------------------------- the command


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=_ints, default=list(SIZES), help="host counts (default 1,2,4,8,16)")
    parser.add_argument("--max-hosts", type=int, help="leave out the sizes above N (a small machine)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per point, median taken (default 2)")
    parser.add_argument("--profile", default="cg_5tok")
    parser.add_argument("--forks", type=int, default=50, help="deploy --forks (default 50)")
    parser.add_argument("--control-cores", type=int, default=16, help="projection: control cores C")
    parser.add_argument("--serial", default="10%", help="projection: batch, N or P%% (default 10%%)")
    parser.add_argument(
        "--restart-s",
        type=float,
        help="projection: one batch's deploy time t1 (default: a full deploy of the smallest size, "
        "measured; real GPU hosts take their model's load time)",
    )
    parser.add_argument("--project", type=_ints, default=list(PROJECT), help="projection: host counts")
    parser.add_argument("--json", type=Path, help="write the rows and the projection here")
    args = parser.parse_args()
    args.sizes = sorted(set(args.sizes))
    if args.max_hosts is not None:
        args.sizes = [n for n in args.sizes if n <= args.max_hosts]
    if not args.sizes or not all(1 <= n <= nspawn.MAX_HOSTS for n in args.sizes):
        parser.error(f"--sizes: between 1 and {nspawn.MAX_HOSTS} hosts, at least one within --max-hosts")
    serial = re.fullmatch(r"([1-9]\d*)(%?)", args.serial)
    if not serial or (serial[2] and int(serial[1]) > 100):
        parser.error("--serial: a host count such as 50, or a percentage such as 10%")
    if min(args.repeat, args.forks, args.control_cores) < 1:
        parser.error("--repeat, --forks and --control-cores are at least 1")
    return args


def _ints(text: str) -> list[int]:
    return [int(word) for word in text.split(",") if word.strip()]


def main() -> None:
    args = parse_args()
    seen = nspawn.status()
    if seen.exists and len(seen.hosts) != max(args.sizes):
        nspawn.down()
    state = nspawn.up(hosts=max(args.sizes))
    # After the lab is up, so that nothing of the lab's (its containers) can become our child.
    subreaper = become_subreaper()
    names = [h.name for h in state.hosts]
    paths = [str(CHECKOUT), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    base = [sys.executable, "-m", "orchestrator", "deploy", "-i", str(state.inventory), "-p", args.profile]
    base += ["--forks", str(args.forks), "--json"]
    masters: set[int] = set()
    measure([*base, "--limit", ",".join(names)], env, masters)  # every host on the profile first
    rows = measure_sizes(args, base, env, names, masters)
    print_notes(subreaper, masters, max(args.sizes))
    projected = projection(args, rows)
    print_projection(projected)
    if args.json:
        found = {"profile": args.profile, "forks": args.forks, "repeat": args.repeat}
        found["masters_counted"] = len(masters) if subreaper else None
        args.json.write_text(json.dumps({**found, "rows": rows, "projection": projected}, indent=2))
        print(f"wrote {args.json}")


#: A restart that failed on a lab host is measured again this many times (see restart()).
RESTART_TRIES = 3


def restart(base: list[str], limit: list[str], env: dict[str, str], masters: set[int]) -> Run:
    """One --force-restart deploy. On this 2-core VM, 16 lab hosts restarting at once sometimes
    get `status=219/CGROUP` from their systemd (cgroup v1 inside systemd-nspawn: "Failed to kill
    control group ... Input/output error"), a limit of the lab, not of the control side: such a
    run is said on stderr, the hosts are healed with a plain deploy, and it is measured again."""
    for attempt in range(1, RESTART_TRIES + 1):
        try:
            return measure([*base, *limit, "--force-restart"], env, masters)
        except SystemExit as failed:
            if attempt == RESTART_TRIES:
                raise
            said = re.findall(r'"diagnosis": "([^"]+)"', str(failed.code))
            why = said[0][:160] if said else "see the deploy's report"
            print(f"  (a restart failed on a lab host, measured again: {why})", file=sys.stderr)
            measure([*base, *limit], env, set())  # the failed hosts back up
    raise AssertionError("unreachable")


def measure_sizes(
    args: argparse.Namespace, base: list[str], env: dict[str, str], names: list[str], masters: set[int]
) -> list[dict]:
    """The table's rows, printed as each is measured."""
    first = args.sizes[0]
    print(f"profile {args.profile}, forks {args.forks}, median of {args.repeat} runs, whole command;")
    print("CPU: user + system s on the control side (process tree + the ssh masters it left), see --help")
    print(
        f"{'hosts':>5}  {'no-op s':>8}  {'full s':>8}  {'no-op CPU':>9}  {'full CPU':>9}  {'CPU/host':>8}  "
        f"{'of it ssh':>9}  {'1-core':>7}  {f'no-op vs {first}':>10}"
    )
    rows: list[dict] = []
    for n in args.sizes:
        limit = ["--limit", ",".join(names[:n])]
        noop = summary([measure([*base, *limit], env, masters) for _ in range(args.repeat)])
        try:
            full = summary([restart(base, limit, env, masters) for _ in range(args.repeat)])
        except SystemExit as failed:  # the table and projection still come from the other sizes
            print(f"{n:>5}  {noop['wall_s']:7.2f}s  a restart failed {RESTART_TRIES} times: not measured")
            print(str(failed.code)[:600], file=sys.stderr)
            measure([*base, *limit], env, set())  # the failed hosts back up for the next size
            continue
        ratio = noop["wall_s"] / rows[0]["noop"]["wall_s"] if rows else 1.0
        rows.append(
            {
                "hosts": n,
                "noop": noop,
                "full": full,
                "cpu_per_host_full_s": full["cpu_s"] / n,
                "noop_vs_first": ratio,
            }
        )
        floor = "-" if full["floor_s"] is None else f"{full['floor_s']:6.2f}s"
        print(
            f"{n:>5}  {noop['wall_s']:7.2f}s  {full['wall_s']:7.2f}s  {noop['cpu_s']:8.2f}s  "
            f"{full['cpu_s']:8.2f}s  {full['cpu_s'] / n:7.2f}s  {full['masters_cpu_s']:8.2f}s  "
            f"{floor:>7}  {ratio:9.2f}x"
        )
    print(f"goal: no-op on {args.sizes[-1]} hosts <= 1.5x the no-op on {first} host(s)")
    return rows


def print_notes(subreaper: bool, masters: set[int], hosts: int) -> None:
    print(
        "CPU/host: full CPU / hosts (the fixed part included). 'of it ssh': the ssh ControlPersist masters, "
        "which\ndaemonise, so the tree never reaps them (its rusage leaves them out): counted apart, this "
        "script being\ntheir subreaper; they only relay bytes. '1-core': the busier of orchestrator's and "
        "ansible-playbook's own\nCPU (full). The lab hosts' processes are not counted; on the lab they "
        "share the control machine's\ncores, which slows the wall times, not the CPU seconds."
    )
    if not subreaper:
        print("note: no PR_SET_CHILD_SUBREAPER here: the ssh masters' CPU is not counted (0)")
    elif len(masters) < hosts:
        print(
            f"note: {len(masters)} ssh masters were this script's for {hosts} hosts: the others' "
            "connections went through\nmasters started before it (another run within ControlPersist's "
            "120 s), whose CPU is not counted"
        )


def projection(args: argparse.Namespace, rows: list[dict]) -> dict | None:
    """The fits over the measured rows and the projected rollouts (FORMULA); None with one size."""
    if len(rows) < 2:
        return None
    fits = {kind: fit_line([(r["hosts"], r[kind]["cpu_s"]) for r in rows]) for kind in ("full", "noop")}
    floors = {kind: _floor_fit([(r["hosts"], r[kind]["floor_s"]) for r in rows]) for kind in fits}
    t1 = {"full": args.restart_s or rows[0]["full"]["wall_s"], "noop": rows[0]["noop"]["wall_s"]}
    t1_hosts = "--restart-s" if args.restart_s else rows[0]["hosts"]
    projected = [
        project(kind, n, args.serial, args.control_cores, fits[kind], floors[kind], t1[kind])
        for kind in ("full", "noop")
        for n in args.project
    ]
    return {
        "formula": FORMULA.format(
            forks_rule=f"min(B, C x {FORKS_PER_CORE})", per_core=FORKS_PER_CORE, t1_hosts=t1_hosts
        ),
        "serial": args.serial,
        "control_cores": args.control_cores,
        "fits": {kind: asdict(line) for kind, line in fits.items()},
        "floor_fits": {kind: asdict(line) if line else None for kind, line in floors.items()},
        "t1_s": t1,
        "rows": [asdict(p) for p in projected],
    }


def _floor_fit(points: list[tuple[int, float | None]]) -> Line | None:
    """The 1-core floor's line, where it was read at two sizes at least."""
    known = [(x, y) for x, y in points if y is not None]
    return fit_line(known) if len({x for x, _ in known}) >= 2 else None


def print_projection(found: dict | None) -> None:
    if found is None:
        print("projection: needs two sizes at least")
        return
    print(
        f"\nPROJECTION, not a measurement: N hosts, --serial {found['serial']}, C = {found['control_cores']}"
    )
    print(found["formula"])
    for kind, line in found["fits"].items():
        print(
            f"  {kind}: a = {line['a']:.2f} s, b = {line['b']:.3f} s/host; t1 = {found['t1_s'][kind]:.2f} s"
        )
    for kind, floor in found["floor_fits"].items():
        if floor:
            print(f"  {kind} 1-core floor: a' = {floor['a']:.2f} s, b' = {floor['b']:.3f} s/host")
    print(
        f"{'kind':>5}  {'hosts':>5}  {'batch':>5}  {'batches':>7}  {'forks':>5}  {'ctl CPU':>8}  "
        f"{'CPU-bound':>9}  {'1-core':>7}  {'host-bound':>10}  {'wall':>8}  bound by"
    )
    for p in found["rows"]:
        one_core = "-" if p["floor_s"] is None else f"{p['floor_s']:6.0f}s"
        print(
            f"{p['kind']:>5}  {p['hosts']:>5}  {p['batch']:>5}  {p['batches']:>7}  {p['forks']:>5}  "
            f"{p['cpu_s']:7.0f}s  {p['cpu_bound_s']:8.0f}s  {one_core:>7}  {p['host_bound_s']:9.0f}s  "
            f"{p['wall_s']:7.0f}s  {p['bound']}"
        )
    print(
        "Assumed: each --serial batch costs t1 (whole command: over by its start-up), and the fit's a "
        "once per rollout;\nt1 is the stand-in's restart unless --restart-s: a real server's is its "
        "model's load time."
    )
    for p in found["rows"]:
        if p["kind"] == "full":
            when = f"about {p['wall_s'] / 60:.0f} min, bound by {p['bound']}"
            print(f"  {p['hosts']} hosts: deploy --serial {p['batch']} --forks {p['forks']}: {when}")


if __name__ == "__main__":
    main()
