"""`nvidia-smi` stand-in: the query modes a deployment tool uses, byte for byte as the real one.

Shapes, messages and exit codes follow captures from a real H200 (driver 580.159.04), kept in
the repository's tests/data/nvidia-smi/. Like the real tool it ignores CUDA_VISIBLE_DEVICES.
Memory figures come from the registry (nvidia_standin.registry); utilization is always 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from nvidia_standin import registry

EXIT_BAD_ARGS = 2
EXIT_NO_DEVICE = 6
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


@dataclass(frozen=True)
class Field:
    """One queryable field: its header as nvidia-smi prints it, and the unit --format=csv adds."""

    header: str
    unit: str = ""


GPU_FIELDS = {
    "index": Field("index"),
    "uuid": Field("uuid"),
    "gpu_uuid": Field("uuid"),
    "name": Field("name"),
    "gpu_name": Field("name"),
    "pci.bus_id": Field("pci.bus_id"),
    "gpu_bus_id": Field("pci.bus_id"),
    "memory.used": Field("memory.used [MiB]", "MiB"),
    "memory.total": Field("memory.total [MiB]", "MiB"),
    "memory.free": Field("memory.free [MiB]", "MiB"),
    "memory.reserved": Field("memory.reserved [MiB]", "MiB"),
    "utilization.gpu": Field("utilization.gpu [%]", "%"),
    "utilization.memory": Field("utilization.memory [%]", "%"),
    "count": Field("count"),
    "driver_version": Field("driver_version"),
    "temperature.gpu": Field("temperature.gpu"),
    "persistence_mode": Field("persistence_mode"),
    "compute_mode": Field("compute_mode"),
}

APP_FIELDS = {
    "pid": Field("pid"),
    "process_name": Field("process_name"),
    "name": Field("process_name"),
    "used_memory": Field("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": Field("used_gpu_memory [MiB]", "MiB"),
    "gpu_uuid": Field("gpu_uuid"),
    "gpu_bus_id": Field("gpu_bus_id"),
    "gpu_name": Field("gpu_name"),
}


class SmiExit(Exception):
    """Stop with this stdout text and exit code (nvidia-smi prints its errors on stdout)."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code


@dataclass
class Request:
    list_gpus: bool = False
    ids: str | None = None
    query_gpu: str | None = None
    query_apps: str | None = None
    fmt: str | None = None


_VALUED = {"--id": "ids", "-i": "ids", "--query-gpu": "query_gpu", "--query-compute-apps": "query_apps"}
_VALUED.update({"--format": "fmt"})


def parse_args(argv: list[str]) -> Request:
    """nvidia-smi's loose syntax: `--opt=value` or `--opt value`, `-i N` or `-iN`."""
    req = Request()
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-L", "--list-gpus"):
            req.list_gpus = True
            continue
        name, eq, value = arg.partition("=")
        if name.startswith("-i") and name not in _VALUED and not eq:
            name, value, eq = "-i", name[2:], "="
        if name not in _VALUED:
            raise SmiExit(INVALID_ARGS, EXIT_BAD_ARGS)
        if not eq:
            if not args:
                raise SmiExit(INVALID_ARGS, EXIT_BAD_ARGS)
            value = args.pop(0)
        setattr(req, _VALUED[name], value)
    return req


def select_gpus(cfg: registry.GpuConfig, ids: str | None) -> list[int]:
    """The GPU indices an `--id` names (index or UUID, comma list); all when none."""
    if ids is None:
        return list(range(cfg.count))
    chosen = []
    for item in ids.split(","):
        item = item.strip()
        if item.isdigit() and int(item) < cfg.count:
            chosen.append(int(item))
        elif item in cfg.uuids:
            chosen.append(cfg.uuids.index(item))
        else:
            raise SmiExit("No devices were found\n", EXIT_NO_DEVICE)
    return chosen


def parse_format(fmt: str | None) -> tuple[bool, bool]:
    """(header, units) from `csv[,noheader][,nounits]`."""
    parts = [p.strip() for p in (fmt or "").split(",")]
    if not parts or parts[0] != "csv" or not set(parts[1:]) <= {"noheader", "nounits"}:
        raise SmiExit(INVALID_ARGS, EXIT_BAD_ARGS)
    return "noheader" not in parts, "nounits" not in parts


def check_fields(names: list[str], known: dict[str, Field]) -> None:
    for name in names:
        if name not in known:
            raise SmiExit(f'Field "{name}" is not a valid field to query.\n\n', EXIT_BAD_ARGS)


def gpu_value(cfg: registry.GpuConfig, index: int, name: str) -> object:
    used = registry.used_mib(index)
    values: dict[str, Callable[[], object]] = {
        "index": lambda: index,
        "uuid": lambda: cfg.uuid(index),
        "name": lambda: cfg.name,
        "pci.bus_id": lambda: cfg.bus_id(index),
        "memory.used [MiB]": lambda: used,
        "memory.total [MiB]": lambda: cfg.total_mib,
        "memory.free [MiB]": lambda: cfg.total_mib - used,
        "memory.reserved [MiB]": lambda: 0,
        "utilization.gpu [%]": lambda: 0,
        "utilization.memory [%]": lambda: 0,
        "count": lambda: cfg.count,
        "driver_version": lambda: cfg.driver_version,
        "temperature.gpu": lambda: 31,
        "persistence_mode": lambda: "Enabled",
        "compute_mode": lambda: "Default",
    }
    return values[GPU_FIELDS[name].header]()


def app_value(cfg: registry.GpuConfig, index: int, holder: registry.Holder, name: str) -> object:
    values: dict[str, Callable[[], object]] = {
        "pid": lambda: holder.pid,
        "process_name": lambda: registry.process_name(holder.pid),
        "used_gpu_memory [MiB]": lambda: holder.mib_per_gpu,
        "gpu_uuid": lambda: cfg.uuid(index),
        "gpu_bus_id": lambda: cfg.bus_id(index),
        "gpu_name": lambda: cfg.name,
    }
    return values[APP_FIELDS[name].header]()


def csv_rows(names: list[str], fields: dict[str, Field], rows: list[list[object]], fmt: str | None) -> str:
    header, units = parse_format(fmt)
    lines = [", ".join(fields[n].header for n in names)] if header else []
    for row in rows:
        cells = []
        for name, value in zip(names, row, strict=True):
            unit = fields[name].unit
            cells.append(f"{value} {unit}" if units and unit else str(value))
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def query_gpus(cfg: registry.GpuConfig, req: Request) -> str:
    names = [n.strip() for n in (req.query_gpu or "").split(",")]
    check_fields(names, GPU_FIELDS)
    gpus = select_gpus(cfg, req.ids)
    return csv_rows(names, GPU_FIELDS, [[gpu_value(cfg, i, n) for n in names] for i in gpus], req.fmt)


def query_apps(cfg: registry.GpuConfig, req: Request) -> str:
    names = [n.strip() for n in (req.query_apps or "").split(",")]
    check_fields(names, APP_FIELDS)
    gpus = select_gpus(cfg, req.ids)
    live = registry.holders()
    rows = [[app_value(cfg, i, h, n) for n in names] for i in gpus for h in live if i in h.gpus]
    return csv_rows(names, APP_FIELDS, rows, req.fmt)


def list_gpus(cfg: registry.GpuConfig, req: Request) -> str:
    return "".join(f"GPU {i}: {cfg.name} (UUID: {cfg.uuid(i)})\n" for i in select_gpus(cfg, req.ids))


def table(cfg: registry.GpuConfig, req: Request) -> str:
    """The default (no query) view, laid out as the real one (tests/gpu/captures/*-table.txt);
    for people, not for parsers. Temperature, power and utilization are fixed figures."""
    gpus = select_gpus(cfg, req.ids)
    wide = "+" + "-" * 89 + "+"
    rule = "+-----------------------------------------+------------------------+----------------------+"
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y") + " " * 7,
        wide,
        f"| NVIDIA-SMI {cfg.driver_version:<23}Driver Version: {cfg.driver_version:<15}"
        f"CUDA Version: {cfg.cuda_version:<9}|",
        rule,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for i in gpus:
        mem = f"{registry.used_mib(i)}MiB / {cfg.total_mib}MiB"
        out.append(f"| {i:>3}  {cfg.name:<25}      On  |   {cfg.bus_id(i)} Off |{'0':>21} |")
        out.append(f"| N/A   31C    P0             75W /  700W |  {mem:>21} |      0%      Default |")
        out.append(f"|{'':41}|{'':24}|{'Disabled':>21} |")
        out.append(rule)
    out += ["", wide, f"| {'Processes:':<88}|"]
    out.append("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |")
    out.append("|        ID   ID                                                               Usage      |")
    out.append("|" + "=" * 89 + "|")
    rows = [(i, h) for i in gpus for h in registry.holders() if i in h.gpus]
    for i, h in rows:
        name = registry.process_name(h.pid)
        name = name if len(name) <= 32 else "..." + name[-29:]  # as the real one cuts a long path
        out.append(f"|{i:>5}   N/A  N/A {h.pid:>15}      C   {name:<32}{f'{h.mib_per_gpu}MiB':>14} |")
    if not rows:
        out.append(f"|  {'No running processes found':<87}|")
    out.append(wide)
    return "\n".join(out) + "\n"


def run(argv: list[str]) -> tuple[str, int]:
    """The output text and exit code of `nvidia-smi argv`."""
    try:
        req = parse_args(argv)
        cfg = registry.load_config()
        if req.query_gpu is not None:
            return query_gpus(cfg, req), 0
        if req.query_apps is not None:
            return query_apps(cfg, req), 0
        if req.list_gpus:
            return list_gpus(cfg, req), 0
        return table(cfg, req), 0
    except SmiExit as stop:
        return stop.text, stop.code


def main(argv: list[str] | None = None) -> int:
    text, code = run(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
