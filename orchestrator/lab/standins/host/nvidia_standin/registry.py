"""The lab's "GPU driver": which GPUs a host has and which processes hold how much of their memory.

Real GPU memory is freed by the driver when a process dies, however it dies. The stand-in
gets the same property without any daemon: each holder writes one file named after its
PID, carrying the PID's start time from /proc/PID/stat; readers count only files whose PID
is alive with that same start time, so a killed (or PID-reused) holder frees its memory at
once, and readers delete stale files they may delete.

Containers: a process in a container (podman's CDI devices `nvidia.com/gpu=N`, see
orchestrator.lab.standins.cdi_spec) has PIDs of its own PID namespace. Every entry names its
writer's namespace (`pidns`, as /proc/PID/ns/pid reads), and a container's is named
`<ns inode>-<pid>.json`, so two containers' PID 1 never share a file. A reader in another
namespace finds the process by that namespace and the PID's last NSpid field, and shows the PID
it sees, as the real driver shows host PIDs to a host nvidia-smi. A reader that cannot see the
namespace (it is inside a container, or not root) counts the entry and leaves it, since it cannot
tell a dead holder from an invisible one.
The GPUs a container was given are the files in NVIDIA_STANDIN_DEVICES (`gpu<N>`, one per CDI
device): its GPU 0, 1, ... are the host's N in ascending order, and entries record host indexes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_ENV = "NVIDIA_STANDIN_CONFIG"
RUN_DIR_ENV = "NVIDIA_STANDIN_RUN_DIR"
#: Set by the CDI spec inside a container: a directory of `gpu<N>` files, one per GPU it was given.
DEVICES_ENV = "NVIDIA_STANDIN_DEVICES"
DEFAULT_CONFIG = Path("/etc/nvidia-standin.json")
DEFAULT_RUN_DIR = Path("/run/nvidia-standin")

#: What nvidia-smi shows as used on a GPU that has any process on it, beyond the processes'
#: own figures: a base plus a share per process. Real captures: one holder of 4614 MiB read
#: 4623 (tests/gpu/captures), two of 3380 + 4426 MiB read 7821 (tests/data/nvidia-smi).
DRIVER_BASE_MIB = 3
DRIVER_PER_PROCESS_MIB = 6

#: PCI bus ids of the eight GPUs of an HGX H200 board, in nvidia-smi's index order.
HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass(frozen=True)
class GpuConfig:
    """The GPUs of this host, as /etc/nvidia-standin.json describes them."""

    count: int = 8
    name: str = "NVIDIA H200"
    total_mib: int = 143771
    driver_version: str = "580.159.04"
    cuda_version: str = "13.0"
    uuids: tuple[str, ...] = ()
    bus_ids: tuple[str, ...] = ()

    def uuid(self, index: int) -> str:
        return self.uuids[index]

    def bus_id(self, index: int) -> str:
        return self.bus_ids[index]


@dataclass
class Holder:
    """One live process holding memory on some GPUs."""

    pid: int
    start_time: int
    gpus: list[int]
    mib_per_gpu: int
    extra: dict = field(default_factory=dict)
    pidns: str | None = None
    """The writer's PID namespace when it was in a container; `pid` is then as the reader sees it."""


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def run_dir() -> Path:
    return Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)


def derived_uuid(seed: str, index: int) -> str:
    """A GPU UUID stable for (host, index): hosts differ, reboots and reinstalls do not."""
    digest = hashlib.sha256(f"{seed}/gpu/{index}".encode()).digest()[:16]
    return f"GPU-{uuid.UUID(bytes=digest)}"


def derived_bus_id(index: int) -> str:
    bus = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else f"{0xE0 + index:02X}"
    return f"00000000:{bus}:00.0"


def load_config(path: Path | None = None) -> GpuConfig:
    """Read the GPU config; UUIDs and bus ids not listed there are derived from the host name."""
    path = path or config_path()
    data = json.loads(path.read_text()) if path.exists() else {}
    count = int(data.get("gpus", 8))
    seed = str(data.get("uuid_seed") or socket.gethostname())
    uuids = list(data.get("uuids", []))[:count]
    uuids += [derived_uuid(seed, i) for i in range(len(uuids), count)]
    bus_ids = list(data.get("bus_ids", []))[:count]
    bus_ids += [derived_bus_id(i) for i in range(len(bus_ids), count)]
    return GpuConfig(
        count=count,
        name=data.get("name", GpuConfig.name),
        total_mib=int(data.get("memory_total_mib", GpuConfig.total_mib)),
        driver_version=data.get("driver_version", GpuConfig.driver_version),
        cuda_version=data.get("cuda_version", GpuConfig.cuda_version),
        uuids=tuple(uuids),
        bus_ids=tuple(bus_ids),
    )


def container_gpus() -> list[int] | None:
    """Inside a container, the host indexes of the GPUs it was given, ascending; None outside."""
    directory = os.environ.get(DEVICES_ENV)
    if not directory:
        return None
    names = (p.name for p in Path(directory).glob("gpu*"))
    return sorted(int(n[3:]) for n in names if n[3:].isascii() and n[3:].isdigit())


def pid_namespace(pid: int | str = "self") -> str | None:
    """`pid:[INODE]`, or None when not readable (another user's process, or gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _entry_name(pid: int) -> str:
    if container_gpus() is None:
        return f"{pid}.json"
    inode = (pid_namespace() or "pid:[0]").strip("pid:[]")
    return f"{inode}-{pid}.json"


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot), or None if the PID is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def process_name(pid: int) -> str:
    """The name real nvidia-smi shows for a process: its argv[0] as started (`python3`,
    `/opt/venv/bin/python3`), not its comm or exe (tests/gpu/captures/argv0-*)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "[Not Found]"


def _ensure_run_dir() -> Path:
    directory = run_dir()
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        # Holders may run as different users (root's gpu-hold, a service user's server).
        with contextlib.suppress(OSError):
            directory.chmod(0o1777)
    return directory


def register(gpus: list[int], mib_per_gpu: int, pid: int | None = None, **extra: object) -> Path:
    """Record (or update) that `pid` (default: this process) holds `mib_per_gpu` on each of `gpus`."""
    pid = pid or os.getpid()
    start = proc_start_time(pid)
    if start is None:
        raise ProcessLookupError(f"no process {pid}")
    entry = {"pid": pid, "start_time": start, "gpus": list(gpus), "mib_per_gpu": int(mib_per_gpu)}
    entry["pidns"] = pid_namespace(pid)
    entry.update(extra)
    path = _ensure_run_dir() / _entry_name(pid)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)  # atomic: a reader sees the old entry or the new one, never half
    return path


def unregister(pid: int | None = None) -> None:
    """Release what `pid` (default: this process) holds; a no-op if it holds nothing."""
    with contextlib.suppress(OSError):
        (run_dir() / _entry_name(pid or os.getpid())).unlink()


def _read_entry(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text())
        known = {"pid", "start_time", "gpus", "mib_per_gpu", "pidns"}
        extra = {k: v for k, v in data.items() if k not in known}
        return Holder(
            int(data["pid"]),
            int(data["start_time"]),
            list(data["gpus"]),
            int(data["mib_per_gpu"]),
            extra,
            data.get("pidns"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def holders() -> list[Holder]:
    """Live holders, ordered by PID; entries of dead or reused PIDs are dropped (and deleted)."""
    directory = run_dir()
    if not directory.is_dir():
        return []
    live = []
    own, inside = pid_namespace(), container_gpus() is not None
    for path in directory.glob("*.json"):
        holder = _read_entry(path)
        # An entry without a namespace is the host's (an older writer): foreign to a container.
        if holder and (holder.pidns != own if holder.pidns else inside):
            seen = _seen_pid(holder)
            if seen is not None:
                holder.pid = seen
            if seen is not None or not _can_see_all():
                live.append(holder)
                continue
        elif holder and proc_start_time(holder.pid) == holder.start_time:
            live.append(holder)
            continue
        with contextlib.suppress(OSError):  # another user's stale file: ignoring it is enough
            path.unlink()
    return sorted(live, key=lambda h: h.pid)


def _can_see_all() -> bool:
    """Whether this reader sees every process of the host: root outside any container."""
    return container_gpus() is None and os.geteuid() == 0


def _seen_pid(holder: Holder) -> int | None:
    """The PID this reader sees for a holder of another PID namespace, if that process is alive."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or pid_namespace(proc.name) != holder.pidns:
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        pid = int(proc.name)
        if nspid and int(nspid[-1]) == holder.pid and proc_start_time(pid) == holder.start_time:
            return pid
    return None


def used_mib(gpu: int, exclude_pid: int | None = None) -> int:
    """memory.used of `gpu` as nvidia-smi reports it (processes plus the driver's share)."""
    on_gpu = [h for h in holders() if gpu in h.gpus and h.pid != exclude_pid]
    if not on_gpu:
        return 0
    return sum(h.mib_per_gpu for h in on_gpu) + DRIVER_BASE_MIB + DRIVER_PER_PROCESS_MIB * len(on_gpu)
