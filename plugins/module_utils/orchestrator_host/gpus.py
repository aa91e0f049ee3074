"""The GPUs: nvidia-smi's CSV, who holds each GPU (an orchestrator unit by cgroup or container
label, or a foreign process), and the wait for a GPU set to be released (killing foreign holders
when asked, never a process of an orchestrator unit).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from .containers import container_units
from .procs import argv0, cgroup_unit, proc_cgroup
from .units import deployed_units

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401

# --- nvidia-smi ----------------------------------------------------------------------------------
GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total")

APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")


def _number(cell: str) -> int | None:
    """`4614`, or `4614 MiB` without nounits; None for `[N/A]`, `[No data]`, `[Not Supported]`."""
    match = re.match(r"\s*(\d+)(\s*MiB)?\s*$", cell)
    return int(match.group(1)) if match else None


def parse_gpus(csv_text: str, fields: Iterable[str] = GPU_FIELDS) -> list[dict]:
    """`--query-gpu=<fields> --format=csv,noheader,nounits` as one dict per GPU."""
    fields = tuple(fields)
    gpus = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields) or _number(cells[0]) is None:
            continue  # not a GPU row (a warning line)
        row = dict(zip(fields, cells, strict=True))
        gpus.append(
            {
                "index": _number(row["index"]),
                "uuid": row["uuid"],
                "name": row["name"],
                "memory_used_mib": _number(row["memory.used"]),
                "memory_total_mib": _number(row["memory.total"]),
            }
        )
    return gpus


def parse_apps(csv_text: str, by_uuid: dict[str, int]) -> list[dict]:
    """`--query-compute-apps=pid,process_name,used_memory,gpu_uuid` (noheader, nounits) as one
    dict per process; `gpu` is its GPU's index (None if the UUID is unknown). A process name
    may hold commas: it is whatever lies between the PID and the last two cells."""
    apps = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < len(APP_FIELDS):
            continue
        pid, name, used, uuid = cells[0], ",".join(cells[1:-2]), cells[-2], cells[-1]
        apps.append(
            {"gpu": by_uuid.get(uuid), "pid": _number(pid), "process_name": name, "used_mib": _number(used)}
        )
    return apps


def query_nvidia_smi(module: Any, nvidia_smi: str) -> tuple[list[dict], list[dict], str]:
    """(gpus, apps, error) as nvidia-smi reports them now; error is '' when it answered."""
    exe = module.get_bin_path(nvidia_smi)
    if not exe:
        return [], [], f"{nvidia_smi} not found on this host"
    texts = []
    for query, fields in (("gpu", GPU_FIELDS), ("compute-apps", APP_FIELDS)):
        argv = [exe, f"--query-{query}={','.join(fields)}", "--format=csv,noheader,nounits"]
        rc, out, err = module.run_command(argv)
        if rc != 0:
            return [], [], f"{' '.join(argv)} exited {rc}: {(out + err).strip()[-200:]}"
        texts.append(out)
    gpus = parse_gpus(texts[0])
    if not gpus:
        return [], [], f"nvidia-smi reported no GPU ({exe} printed {texts[0].strip()[:200]!r})"
    return gpus, parse_apps(texts[1], {g["uuid"]: g["index"] for g in gpus}), ""


def nvidia_smi_snapshot(module: Any, nvidia_smi: str) -> tuple[list[dict], list[dict]]:
    """Every GPU and every compute process now; fails the module when nvidia-smi cannot tell."""
    gpus, apps, error = query_nvidia_smi(module, nvidia_smi)
    if error:
        module.fail_json(msg=error)
    return gpus, apps


# --- GPU release ---------------------------------------------------------------------------------

#: After kill_holders signalled a process, how long its memory may take to be freed even when
#: no release timeout was asked for: a SIGKILLed process lingers as `[No data]` (real H200).
KILLED_RELEASE_S = 10.0


def busy_gpus(gpus: list[dict], apps: list[dict], wanted: list[int], limit: int) -> list[dict]:
    """Checked GPUs above `limit` MiB used, with the processes listed on them. memory.used is
    the signal that never lies (the process list is empty across PID namespaces); where it
    reads `[N/A]` a listed process is all there is to go by."""
    busy = []
    for g in gpus:
        if wanted and g["index"] not in wanted:
            continue
        holders = [a for a in apps if a["gpu"] == g["index"]]
        used = g["memory_used_mib"]
        if (used is None and holders) or (used is not None and used > limit):
            busy.append({"index": g["index"], "memory_used_mib": used, "holders": holders})
    return busy


def foreign_gpus(gpus: list[dict], apps: list[dict], wanted: list[int], unit: str) -> list[dict]:
    """Checked GPUs with a listed process outside `unit`, with those processes as holders
    (memory.used counts our own server too, so only the process list can tell owners apart).
    `apps` carry their `unit` (with_units)."""
    busy = []
    for g in gpus:
        if wanted and g["index"] not in wanted:
            continue
        holders = [a for a in apps if a["gpu"] == g["index"] and a.get("unit") != unit]
        if holders:
            busy.append({"index": g["index"], "memory_used_mib": g["memory_used_mib"], "holders": holders})
    return busy


def with_units(
    apps: list[dict],
    units: Collection[str],
    cgroup_of: Callable[[int | None], str] | None = None,
    containers: dict[int, str] | None = None,
) -> list[dict]:
    """nvidia-smi's processes, each with `unit`: which of `units` (orchestrator's units on this
    host) it runs in, '' for none: a process orchestrator did not start, or one of another PID
    namespace whose PID means nothing here. `cgroup_of` reads /proc/PID/cgroup (proc_cgroup);
    `containers` ({PID: unit}, container_units) places the processes of a container outside its
    unit's cgroup (docker's always are)."""
    cgroup_of = cgroup_of or proc_cgroup
    containers = containers or {}

    def unit(pid: int | None) -> str:
        return (cgroup_unit(cgroup_of(pid), units) or containers.get(pid, "")) if pid else ""

    return [{**a, "unit": unit(a["pid"])} for a in apps]


def owned_apps(module: Any, apps: list[dict], units: Collection[str]) -> list[dict]:
    """with_units, asking the container engines only when a process is in none of `units` by its
    cgroup: a host without containers (or without engines) runs no engine command at all."""
    tagged = with_units(apps, units)
    if not any(a["pid"] and not a["unit"] for a in tagged):
        return tagged
    return with_units(apps, units, containers=container_units(module, units))


def gpu_ranges(indexes: Iterable[int]) -> str:
    """GPU indexes as runs: [0, 1, 2, 3, 5] -> "0-3,5" (as orchestrator/cli/view.py shows them)."""
    runs: list[list[int]] = []
    for i in sorted(set(indexes)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _gpus_are(indexes: list[int]) -> str:
    return f"GPU {indexes[0]} is" if len(indexes) == 1 else f"GPUs {gpu_ranges(indexes)} are"


def missing_gpus(wanted: list[int], gpus: list[dict]) -> str:
    """Which GPUs of the set nvidia-smi does not report, as a person reads it; '' when none."""
    have = [g["index"] for g in gpus]
    missing = sorted(set(wanted) - set(have))
    if not missing:
        return ""
    count = f"{len(have)} GPU{'' if len(have) == 1 else 's'}"
    return (
        f"the server uses GPU {gpu_ranges(sorted(wanted))} ({len(wanted)}: TP x DP, on server.gpus); "
        f"{_gpus_are(missing)} not on this host: nvidia-smi reports {count} ({gpu_ranges(have)})"
    )


def _mib(value: int | None) -> str:
    return "?" if value is None else str(value)


def _holder(h: dict) -> str:
    of = f" of {h['unit']}" if h.get("unit") else ""
    return f"PID {_mib(h['pid'])} {h['process_name']} {_mib(h['used_mib'])} MiB{of}"


def describe(busy: list[dict], foreign_only: bool = False) -> str:
    """One clause per busy GPU: index, MiB used, and each holder's PID, name, MiB and
    orchestrator unit (when it runs in one)."""
    parts = []
    for b in busy:
        who = ", ".join(_holder(h) for h in b["holders"])
        who = who or "no process listed (another PID namespace?)"
        if foreign_only:  # memory.used also counts our own server here: name only the others
            parts.append(f"GPU {b['index']} is used by {who}")
        else:
            parts.append(f"GPU {b['index']} has {_mib(b['memory_used_mib'])} MiB used by {who}")
    return "; ".join(parts)


def kill(holders: list[dict], name_of: Callable[[int | None], str | None] = argv0) -> list[dict]:
    """SIGTERM each holder, SIGKILL what is left after 5 s; returns the ones signalled. Only a
    PID whose argv[0] is the name nvidia-smi listed is touched, so a PID from another
    namespace (or a `[No data]` row of one already dying) is never signalled by mistake; and
    never a process of an orchestrator unit (`unit`, with_units): a neighbouring server on
    this host is stopped by its own unit, not killed as a holder of ours."""
    targets = [
        h for h in holders if h["pid"] and not h.get("unit") and name_of(h["pid"]) == h["process_name"]
    ]
    for h in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(h["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{h['pid']}") for h in targets):
        time.sleep(0.1)
    for h in targets:
        if os.path.exists(f"/proc/{h['pid']}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(h["pid"], signal.SIGKILL)
    return targets


def wait_idle(
    module: Any,
    *,
    paths: dict,
    nvidia_smi: str,
    gpus: list[int],
    max_used_mib: int,
    release_timeout_s: float,
    poll_interval_s: float,
    kill_holders: bool,
    allow_unit: str,
    check_mode: bool,
) -> dict:
    """Poll nvidia-smi until the checked GPUs (`gpus`; [] every GPU) are idle or
    release_timeout_s has passed; with kill_holders, kill what holds them once, but never a
    process of an orchestrator unit. Returns {idle, checked, gpus, holders, busy, waited_s,
    killed}, each holder with its `unit`; the caller decides whether busy GPUs fail it
    (idle_message)."""
    start = time.monotonic()
    deadline = start + release_timeout_s
    units = {*deployed_units(paths), *([allow_unit] if allow_unit else [])}
    killed: list[dict] = []
    while True:
        all_gpus, apps = nvidia_smi_snapshot(module, nvidia_smi)
        missing = missing_gpus(gpus, all_gpus)
        if missing:
            module.fail_json(msg=missing, gpus=all_gpus)
        apps = owned_apps(module, apps, units)
        if allow_unit:
            busy = foreign_gpus(all_gpus, apps, gpus, allow_unit)
        else:
            busy = busy_gpus(all_gpus, apps, gpus, max_used_mib)
        if busy and kill_holders and not check_mode and not killed:
            killed = kill([h for b in busy for h in b["holders"]])
            if killed:
                deadline = max(deadline, time.monotonic() + KILLED_RELEASE_S)
                continue  # look again now that they are gone
        if not busy or time.monotonic() >= deadline:
            break
        time.sleep(poll_interval_s)
    wanted = set(gpus) or {g["index"] for g in all_gpus}
    return {
        "idle": not busy,
        "checked": sorted(wanted),
        "gpus": all_gpus,
        "holders": [a for a in apps if a["gpu"] in wanted],
        "busy": busy,
        "waited_s": round(time.monotonic() - start, 2),
        "killed": killed,
    }


def idle_message(report: dict, release_timeout_s: float, allow_unit: str = "") -> str:
    """Why wait_idle's GPUs are not idle, as a person reads it."""
    if allow_unit:
        return f"GPUs held outside {allow_unit}: {describe(report['busy'], True)}"
    after = f" after waiting {report['waited_s']:.1f} s" if release_timeout_s or report["killed"] else ""
    spared = sorted({h["unit"] for b in report["busy"] for h in b["holders"] if h.get("unit")})
    note = f" ({', '.join(spared)}: another orchestrator unit on this host, never killed)" if spared else ""
    return f"GPUs not idle{after}: {describe(report['busy'])}{note}"
