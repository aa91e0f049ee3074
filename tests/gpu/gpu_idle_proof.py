"""Proof on a real NVIDIA GPU: the gpu_idle role passes, fails naming the holder, and waits for release.

Not a pytest module (CI has no GPU): run it by hand on a machine with nvidia-smi, PyTorch and
ansible-core, from anywhere; see tests/gpu/README.md. It applies the real role (roles/gpu_idle)
with ansible-playbook and `ansible_connection=local`:

  (a) idle GPU                          -> the check passes
  (b) a PyTorch process holds ~4 GiB    -> the check fails naming its PID, name and MiB
  (c) that process gets SIGTERM         -> the check (release timeout 30 s) passes once it is gone

The holder drains for --drain-s seconds after SIGTERM, as a server does, so (c) proves that the
check waits rather than finding the memory already free. Exit status 0 only if all three hold.
With --captures DIR it also saves raw nvidia-smi outputs for comparison with the lab's stand-in.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_QUERY = "index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu"
APPS_QUERY = "pid,process_name,used_memory,gpu_uuid"

# Allocates, prints "PID ALLOCATED_BYTES" once the memory is really taken, then sleeps; on
# SIGTERM it waits `drain` seconds before exiting, like a server finishing its requests.
HOLDER = """
import os, signal, sys, time
import torch
gib, drain = float(sys.argv[1]), float(sys.argv[2])
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
def term(*_):
    time.sleep(drain)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print(os.getpid(), torch.cuda.memory_allocated(), flush=True)
while True:
    time.sleep(1)
"""

PLAYBOOK = """\
---
- name: GPU idle proof
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Apply the gpu_idle role and keep what it returned
      block:
        - name: Check the GPUs
          ansible.builtin.import_role:
            name: orchestrator.sglang.gpu_idle
      always:
        - name: Save the module result
          ansible.builtin.copy:
            content: "{{ __gpu_idle | default({}) | to_json }}"
            dest: "{{ proof_result_file }}"
            mode: "0644"
"""

failures: list[str] = []


def verdict(stage: str, ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {stage}: {what}", flush=True)
    if not ok:
        failures.append(stage)


class Smi:
    """The real nvidia-smi: raw runs, printed as seen, optionally saved as capture files."""

    def __init__(self, exe: str, captures: Path | None) -> None:
        self.exe, self.captures = exe, captures
        self.index: list[str] = []

    def run(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        proc = subprocess.run(
            [self.exe, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
        )
        return proc.returncode, proc.stdout + proc.stderr

    def show(self, label: str, *args: str, save: str = "", env: dict[str, str] | None = None) -> str:
        rc, out = self.run(*args, env=env)
        shown = " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), "nvidia-smi", *args])
        print(f"--- {label}: {shown} (exit {rc})\n{out}", end="" if out.endswith("\n") else "\n")
        if save and self.captures:
            (self.captures / save).write_text(out)
            self.index.append(f"| {save} | `{shown}` | {rc} |")
        return out

    def state(self, label: str, prefix: str = "") -> tuple[str, str]:
        """memory.used per GPU and the compute processes, as a parser sees them."""
        gpus = self.show(
            label,
            f"--query-gpu={GPU_QUERY}",
            "--format=csv,noheader,nounits",
            save=prefix and f"{prefix}-query-gpu.csv",
        )
        apps = self.show(
            label,
            f"--query-compute-apps={APPS_QUERY}",
            "--format=csv,noheader,nounits",
            save=prefix and f"{prefix}-compute-apps.csv",
        )
        return gpus, apps

    def used_mib(self) -> int:
        rc, out = self.run("--query-gpu=memory.used", "--format=csv,noheader,nounits")
        return sum(int(v) for v in out.split()) if rc == 0 else -1


class Check:
    """The gpu_idle role, applied to localhost with ansible-playbook."""

    def __init__(self, work: Path, python: str, nvidia_smi: str) -> None:
        self.work, self.nvidia_smi = work, nvidia_smi
        (work / "inventory.ini").write_text(
            f"[gpu]\nlocalhost ansible_connection=local ansible_python_interpreter={python}\n"
        )
        (work / "proof.yml").write_text(PLAYBOOK)
        # The checkout as the collection orchestrator.sglang
        # (orchestrator/hosts/ansible_config.py collections_dir).
        collection = work / "collections"
        (collection / "ansible_collections" / "orchestrator").mkdir(parents=True)
        (collection / "ansible_collections" / "orchestrator" / "sglang").symlink_to(REPO)
        self.env = {
            **os.environ,
            "ANSIBLE_COLLECTIONS_PATH": str(collection),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
            "LC_ALL": os.environ.get("LC_ALL") or "C.UTF-8",  # ansible-core refuses a non-UTF-8 locale
        }

    def run(self, release_timeout_s: int) -> tuple[int, dict, str, float]:
        """(playbook exit, the module's result, the playbook's output, seconds it took)."""
        result_file = self.work / "result.json"
        result_file.unlink(missing_ok=True)
        extra = {
            "gpu_idle_release_timeout_s": release_timeout_s,
            "gpu_idle_nvidia_smi": self.nvidia_smi,
            # Where orchestrator units keep their facts (none here: every holder is foreign).
            "gpu_idle_paths": {
                "unit_dir": str(self.work / "units"),
                "state_dir": str(self.work / "state"),
                "lock_dir": str(self.work / "lock"),
            },
            "proof_result_file": str(result_file),
        }
        argv = [sys.executable, "-m", "ansible", "playbook", "-i", str(self.work / "inventory.ini")]
        argv += ["-e", json.dumps(extra), str(self.work / "proof.yml")]
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=self.work)
        took = time.monotonic() - start
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        return proc.returncode, result, proc.stdout + proc.stderr, took


def run_check(check: Check, label: str, release_timeout_s: int) -> tuple[int, dict, float]:
    rc, result, output, took = check.run(release_timeout_s)
    print(f"--- {label}: gpu_idle (release_timeout_s={release_timeout_s}) exit {rc} in {took:.1f} s")
    fatal = [line for line in output.splitlines() if line.startswith(("fatal:", "ERROR"))]
    print("\n".join(fatal) if fatal else "(no fatal line)")
    print(
        f"module: idle={result.get('idle')} waited_s={result.get('waited_s')} msg={result.get('msg', '')!r}"
    )
    if not result:
        print(output)
    return rc, result, took


def holder_row(apps: str, pid: int) -> list[str] | None:
    for line in apps.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if cells and cells[0] == str(pid):
            return cells
    return None


def proc_names(pid: int) -> str:
    """What Linux calls the process, to compare with nvidia-smi's process_name."""
    base = Path(f"/proc/{pid}")
    try:
        comm = (base / "comm").read_text().strip()
        argv0 = (base / "cmdline").read_bytes().split(b"\0")[0].decode()
        exe = os.readlink(base / "exe")
    except OSError as err:
        return f"(cannot read /proc/{pid}: {err})"
    return f"comm={comm!r} argv[0]={argv0!r} exe={exe!r}"


def start_holder(
    python: str, gib: float, drain_s: float, argv0: str | None = None
) -> tuple[subprocess.Popen, int]:
    argv = [argv0 or python, "-c", HOLDER, str(gib), str(drain_s)]
    env = dict(os.environ)
    if argv0:  # Python finds its venv through argv[0]: hand it this venv's packages instead
        env["PYTHONPATH"] = os.pathsep.join([*site.getsitepackages(), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(argv, executable=python, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line:
        raise SystemExit(f"FAIL holder: the PyTorch holder exited {proc.wait()} before allocating")
    print(
        f"holder: PID {line[0]} allocated {int(line[1]) / 2**20:.0f} MiB in PyTorch; {proc_names(proc.pid)}"
    )
    return proc, int(line[0])


def stage_a(smi: Smi, check: Check) -> None:
    print("\n=== (a) idle GPU: the check passes")
    smi.state("(a) before", prefix="idle")
    rc, result, _ = run_check(check, "(a)", 0)
    verdict("(a)", rc == 0 and result.get("idle") is True, f"exit {rc}, idle={result.get('idle')}")


def stage_b(smi: Smi, check: Check, holder_pid: int) -> None:
    print(f"\n=== (b) PID {holder_pid} holds memory: the check fails naming it")
    gpus, apps = smi.state("(b) with the holder", prefix="busy")
    row = holder_row(apps, holder_pid)
    used = sum(int(line.split(",")[4]) for line in gpus.splitlines() if line.strip())
    listed = sum(
        int(r.split(",")[2]) for r in apps.splitlines() if r.strip() and r.split(",")[2].strip().isdigit()
    )
    print(f"memory.used {used} MiB; compute-apps list {listed} MiB in all; holder row: {row}")
    if row is None:
        verdict("(b)", False, f"nvidia-smi does not list PID {holder_pid} (another PID namespace?)")
        return
    _, name, mib, _ = row
    rc, result, _ = run_check(check, "(b)", 0)
    msg = result.get("msg", "")
    named = f"PID {holder_pid} {name} {mib} MiB" in msg
    verdict(
        "(b)",
        rc != 0 and result.get("idle") is False and named,
        f"exit {rc}, message names 'PID {holder_pid} {name} {mib} MiB': {named}",
    )


def watch_release(smi: Smi, proc: subprocess.Popen, t0: float, seen: dict[str, float]) -> None:
    """From SIGTERM on: when the holder exited, when memory.used first read 0."""
    waiter = threading.Thread(target=lambda: (proc.wait(), seen.setdefault("exited", time.monotonic() - t0)))
    waiter.start()
    while time.monotonic() - t0 < 60:
        if smi.used_mib() == 0:
            seen["released"] = time.monotonic() - t0
            break
        time.sleep(0.1)
    waiter.join(timeout=60)


def stage_c(smi: Smi, check: Check, proc: subprocess.Popen, pid: int, timeout_s: int) -> None:
    print(f"\n=== (c) SIGTERM to PID {pid}: the check (release_timeout_s={timeout_s}) passes once it is gone")
    seen: dict[str, float] = {}
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    watcher = threading.Thread(target=watch_release, args=(smi, proc, t0, seen))
    watcher.start()
    rc, result, took = run_check(check, "(c)", timeout_s)
    done = time.monotonic() - t0
    watcher.join()
    print(
        f"after SIGTERM: holder exited at {seen.get('exited', -1):.2f} s, memory.used read 0 at "
        f"{seen.get('released', -1):.2f} s, the check passed at {done:.2f} s "
        f"(module waited {result.get('waited_s')} s; playbook {took:.1f} s)"
    )
    smi.state("(c) after", prefix="released")
    ok = rc == 0 and result.get("idle") is True and done <= timeout_s + 15
    verdict(
        "(c)",
        ok,
        f"exit {rc}, idle={result.get('idle')}, released {seen.get('released', -1):.2f} s after SIGTERM",
    )


def capture_shapes(smi: Smi) -> None:
    """Outputs the stand-in must match, saved under --captures (idle GPU)."""
    smi.show("list", "-L", save="list-L.txt")
    smi.show("header", f"--query-gpu={GPU_QUERY}", "--format=csv", save="idle-query-gpu-header.csv")
    smi.show(
        "header", f"--query-compute-apps={APPS_QUERY}", "--format=csv", save="idle-compute-apps-header.csv"
    )
    smi.show("bad field", "--query-gpu=index,bogus.field", "--format=csv,noheader", save="badfield.txt")
    smi.show("bad id", "--id=7", "--query-gpu=index", "--format=csv,noheader", save="badid.txt")
    smi.show(
        "cvd",
        "--query-gpu=index",
        "--format=csv,noheader",
        save="cvd5.txt",
        env={"CUDA_VISIBLE_DEVICES": "5"},
    )
    smi.show("table", save="idle-table.txt")


def capture_busy(smi: Smi) -> None:
    smi.show("header", f"--query-gpu={GPU_QUERY}", "--format=csv", save="busy-query-gpu-header.csv")
    smi.show(
        "header", f"--query-compute-apps={APPS_QUERY}", "--format=csv", save="busy-compute-apps-header.csv"
    )
    smi.show("table", save="busy-table.txt")


#: argv[0]s unlike the holder's comm (python3) and exe; the long one shows how names are cut.
ARGV0S = ("gpu-proof-argv0", "/opt/a-rather-long-virtualenv-path/for-the-server/bin/gpu-proof-argv0")


def capture_names(smi: Smi, python: str) -> None:
    """Which of comm, argv[0] or exe nvidia-smi shows as process_name, and how it cuts a long one."""
    print("\n=== names: holders whose argv[0] differs from their comm and exe")
    holders = [start_holder(python, 1, 0, argv0=argv0) for argv0 in ARGV0S]
    query = (f"--query-compute-apps={APPS_QUERY}", "--format=csv")
    smi.show("names", *query, save="argv0-compute-apps-header.csv")
    smi.show("names", save="argv0-table.txt")
    if smi.captures:
        (smi.captures / "argv0-proc.txt").write_text(
            "".join(f"PID {p}: {proc_names(p)}\n" for _, p in holders)
        )
    for proc, _ in holders:
        proc.terminate()
        proc.wait()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="Python with PyTorch (holder, module)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--hold-gib", type=float, default=4.0)
    parser.add_argument("--drain-s", type=float, default=3.0, help="holder's delay between SIGTERM and exit")
    parser.add_argument("--release-timeout-s", type=int, default=30)
    parser.add_argument("--captures", type=Path, help="also save raw nvidia-smi outputs here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.captures:
        args.captures.mkdir(parents=True, exist_ok=True)
    smi = Smi(args.nvidia_smi, args.captures)
    with tempfile.TemporaryDirectory(prefix="gpu-idle-proof-") as tmp:
        check = Check(Path(tmp), args.python, args.nvidia_smi)
        if args.captures:
            capture_shapes(smi)
        stage_a(smi, check)
        proc, pid = start_holder(args.python, args.hold_gib, args.drain_s)
        try:
            stage_b(smi, check, pid)
            if args.captures:
                capture_busy(smi)
            stage_c(smi, check, proc, pid, args.release_timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if args.captures:
            capture_names(smi, args.python)
            (args.captures / "index.md").write_text(
                "| file | command | exit |\n|---|---|---|\n" + "\n".join(smi.index) + "\n"
            )
    print(f"\n{'FAIL: ' + ', '.join(failures) if failures else 'PASS: (a), (b), (c)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
