"""What orchestrator's modules know about a host, in one place (roles/*/library import it).

`systemctl show` parsing, cgroup membership (and a container's unit, by its label), nvidia-smi's
CSV, the unit digest, host paths, the deploy lock, the GPU release wait and the preflight checks
(on the host's Python, or in a container image). Pure functions (text in,
values out) are kept apart from the ones that read the host, so that tests/unit/modules can
prove them on captured output. Paths are never defaults here: the control machine passes
them (`paths` = {unit_dir, state_dir, lock_dir}, orchestrator/hostplan.py HostPaths).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

# ansible's arg_spec and urllib are imported where they are used: the control machine loads this
# file for its parsers (orchestrator/paths.module_utils; systemd_check on every render), and the
# two would double the time that takes.

# --- option specs shared by several modules ------------------------------------------------
# Each option's one declaration, with its description (AnsibleModule ignores that key):
# scripts/role_specs.py writes the modules' documentation and the roles' specs from it.

PATHS_OPTIONS: dict[str, dict[str, Any]] = {
    "unit_dir": {"type": "str", "required": True, "description": "Where unit files live."},
    "state_dir": {
        "type": "str",
        "required": True,
        "description": "Root-only state directory (the units' facts, last-good records, images' cache).",
    },
    "lock_dir": {"type": "str", "required": True, "description": "Where deploy locks live (tmpfs)."},
}
PATHS_SPEC: dict[str, Any] = {
    "type": "dict",
    "required": True,
    "options": PATHS_OPTIONS,
    "description": "Where orchestrator keeps things on the host (orchestrator/hostplan.py HostPaths).",
}

#: The deploy lock a run takes (orchestrator/hostplan.py LockSpec).
LOCK_OPTIONS: dict[str, dict[str, Any]] = {
    "holder": {"type": "str", "required": True},
    "run_id": {"type": "str", "required": True},
    "ttl_s": {"type": "float", "required": True},
    "wait_s": {"type": "float", "required": True},
    "control": {"type": "str", "default": ""},
    "pid": {"type": "int", "default": 0},
    "live_pids": {"type": "list", "elements": "int", "default": []},
    "profile": {"type": "str", "default": ""},
    "keep": {"type": "bool", "default": False},
}

#: The read-only checks before a restart (orchestrator/hostplan.py PreflightChecks): the
#: `checks` option of sglang_preflight and the `preflight` option of sglang_probe.
PREFLIGHT_OPTIONS: dict[str, dict[str, Any]] = {
    "python": {"type": "str", "required": True, "description": "The python executable of the unit."},
    "sglang_version": {
        "type": "str",
        "required": True,
        "description": "SGLang version the plan was rendered for.",
    },
    "flags": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": "Every flag the plan renders; each must be in C(--help).",
    },
    "model_path": {"type": "str", "required": True, "description": "Target model directory."},
    "draft_model_path": {
        "type": "str",
        "default": "",
        "description": "Draft model directory; empty if none.",
    },
    "algorithm": {"type": "str", "default": "", "description": "Speculative algorithm; empty if none."},
    "gpus": {
        "type": "list",
        "elements": "int",
        "required": True,
        "description": (
            "nvidia-smi indices of the GPUs the server uses on this host, the only ones looked at. "
            "Each must exist; a process on one of them outside I(unit_name) is a problem, named as "
            "another orchestrator unit (never killed) where it runs in one."
        ),
    },
    "port": {"type": "int", "required": True, "description": "HTTP port of the server."},
    "skip_flags_if_digest": {
        "type": "str",
        "default": "",
        "description": (
            "Skip the C(--help) check when the installed unit has this digest (its flags already run)."
        ),
    },
    "log_dir": {"type": "str", "default": "/var/log", "description": "Where the journal writes."},
    "min_free_mib": {"type": "int", "default": 1024, "description": "Free space the logs need."},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi", "description": "The nvidia-smi executable."},
    "allow_gpu_holders": {
        "type": "bool",
        "default": False,
        "description": (
            "Processes outside I(unit_name) on the GPUs are no problem (the deploy kills them); those "
            "of another orchestrator unit still are (never killed)."
        ),
    },
    "unit_content": {
        "type": "str",
        "default": "",
        "description": (
            "The planned unit text, checked with C(systemd-analyze verify) before anything stops "
            "(unless that very text is installed); a non-zero exit, or a line of the unit systemd says "
            "it ignores or cannot parse, is a problem; empty skips the check."
        ),
    },
    "user": {
        "type": "str",
        "default": "root",
        "description": "The user the server runs as (service.user); it must exist on the host.",
    },
    "engine": {
        "type": "str",
        "default": "",
        "choices": ["", "docker", "podman"],
        "description": [
            "The container engine of a container runtime (runtime.kind); empty for SGLang on the "
            "host's I(python).",
            "With an engine, it must be installed and answer C(ENGINE version); the image must be here "
            "(or be pulled at start, as I(pull) allows: preflight never pulls); I(sglang_version) and "
            "I(flags) are checked against the image's own SGLang and C(--help), run once per image in "
            "a throw-away container (C(run --rm --pull=never) with I(run_options)) and cached by image "
            "ID under C(state_dir)/images; I(python) is the image's.",
            "Model and drafter are mounted at the same paths, so their checks read the host's files.",
        ],
    },
    "image": {
        "type": "str",
        "default": "",
        "description": "The image reference (runtime.image) with an I(engine).",
    },
    "pull": {
        "type": "str",
        "default": "missing",
        "choices": ["never", "missing", "always"],
        "description": (
            "When the engine pulls the image (runtime.pull); C(never) makes a missing image a problem."
        ),
    },
    "mounts": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": "The host paths runtime.mounts gives the container; each must exist.",
    },
    "run_options": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": (
            "The unit's engine options a throw-away container of the image also needs on this host "
            "(network, cgroups, ulimits), one word each."
        ),
    },
    "run_words": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": [
            "The unit's C(ENGINE run) command after the verb, one word each, as systemd runs it; empty "
            "skips this check. The engine's own C(create) (never started, removed at once) judges "
            "every option before the stop: a refusal is a problem, with the engine's message and the "
            "options it names. It gets a name and label of its own, no C(-d), C(--replace) or pull; "
            "podman creates it over an empty root file system, docker from the image.",
            "Each C(--device) host path and each I(mounts) source under /dev is resolved on this host: "
            "one that leads to an NVIDIA device node (a link, a directory holding one) is a problem; "
            "GPUs reach the container from the unit's own GPU words only. With docker, whose daemon "
            "opens devices only at start, a C(--device) this host lacks is one too.",
        ],
    },
    "secret_files": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": (
            "The unit's secret files (its C(--config) mount's source, its C(--env-file)), given to "
            "that C(create) as empty files in their place."
        ),
    },
}


def validate_suboptions(module: Any, name: str, spec: dict[str, dict[str, Any]], value: dict) -> dict:
    """`value` checked against `spec`, defaults filled in. For a dict option where {} means
    "none": Ansible would reject {} against required suboptions, so they are checked here."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    result = ArgumentSpecValidator(spec).validate(value)
    if result.error_messages:
        module.fail_json(msg=f"{name}: {'; '.join(result.error_messages)}")
    return result.validated_parameters


# --- systemd -----------------------------------------------------------------------------------


def parse_systemctl_show(text: str) -> dict[str, str]:
    """`systemctl show` output as {property: value}. A value opening with `{` may go on over
    several lines (ExecStart=...), as ansible-core's systemd_service module handles it."""
    parsed: dict[str, str] = {}
    key, multival = "", []
    for line in text.splitlines():
        if multival:
            multival.append(line)
            if line.rstrip().endswith("}"):
                parsed[key] = "\n".join(multival).strip()
                multival = []
            continue
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        if value.lstrip().startswith("{") and not value.rstrip().endswith("}"):
            multival = [value]
        else:
            parsed[key] = value.strip()
    return parsed


def systemctl_show(module: Any, unit: str, props: Iterable[str], *extra_args: str) -> dict[str, str]:
    state, problem = try_systemctl_show(module, unit, props, *extra_args)
    if problem:
        module.fail_json(msg=problem)
    return state


def try_systemctl_show(
    module: Any, unit: str, props: Iterable[str], *extra_args: str
) -> tuple[dict[str, str], str]:
    """`systemctl show`'s properties of `unit`, or ({}, why not) in one line (no systemd running:
    "System has not been booted with systemd ...")."""
    systemctl = module.get_bin_path("systemctl", required=True)
    argv = [systemctl, "show", unit, f"--property={','.join(props)}", *extra_args]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        return {}, f"systemctl show {unit} failed: {' '.join((err or out).split())}"
    return parse_systemctl_show(out), ""


def cgroup_unit(cgroup_text: str, units: Collection[str]) -> str:
    """Which of `units` a /proc/PID/cgroup text puts the process in (or below): a path
    component that is the unit's cgroup name (cg_escape), so sglang.service is not
    sglang.service-b. '' for none."""
    names = {cg_escape(unit): unit for unit in units}
    for line in cgroup_text.splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            if part in names:
                return names[part]
    return ""


#: cgroup_controller_to_string() of systemd 252's controllers (cgroup-util.c).
CGROUP_CONTROLLERS = frozenset(
    [
        "cpu",
        "cpuacct",
        "cpuset",
        "io",
        "blkio",
        "memory",
        "devices",
        "pids",
        "bpf-firewall",
        "bpf-devices",
        "bpf-foreign",
        "bpf-socket-bind",
        "bpf-restrict-network-interfaces",
    ]
)


def cg_escape(name: str) -> str:
    """The name of a unit's cgroup, as systemd's cg_escape() makes it from the unit's: one '_' in
    front of a name that starts with '_' or '.', is a kernel file's (tasks, ...), or whose part
    before its last '.' is "cgroup" or a controller's name (`cpu.service` runs in `_cpu.service`)."""
    if (
        name[:1] in ("", "_", ".")
        or name in ("notify_on_release", "release_agent", "tasks")
        or name.startswith("cgroup.")
        or name.rpartition(".")[0] in CGROUP_CONTROLLERS
    ):
        return f"_{name}"
    return name


def proc_cgroup(pid: int | None) -> str:
    """/proc/PID/cgroup; '' when the process is gone (or `pid` is None)."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return fh.read()
    except OSError:
        return ""


#: Where cgroup v2 is mounted.
CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_procs(control_group: str, root: str = CGROUP_ROOT) -> list[str]:
    """PIDs left in a unit's cgroup (systemctl show's ControlGroup) and every cgroup below it,
    cgroup v2: a unit with Delegate=yes keeps its processes in sub-cgroups (podman's
    --cgroups=split puts conmon in one and the container in another), not in its own."""
    if not control_group:
        return []
    pids = []
    for folder, _, _ in os.walk(f"{root}{control_group}"):
        with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.procs")) as fh:
            pids += fh.read().split()
    return pids


def unit_containers(module: Any, unit: str) -> list[int]:
    """Main PIDs of the running containers labelled with `unit` (labelled_containers): a docker
    container runs under the daemon, so an empty cgroup does not mean it is gone."""
    return [pid for _, label, pid in labelled_containers(module) if label == unit]


def argv0(pid: int | None) -> str | None:
    """argv[0] of a process (what nvidia-smi shows as its name), None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return None


# --- the unit, its files and the deploy lock ---------------------------------------------------


#: What systemd says of a unit line whose setting it drops, cannot read or reads otherwise, while
#: it loads the unit all the same: `systemd-analyze verify` exits 0 and the unit starts without
#: the setting ("Range '5-2' is invalid, 5 > 2, ignoring.", "Failed to parse sec value, ignoring:
#: 1e-05", "Invalid memory limit '101%', ignoring", "Cannot add CPU 8192 to set", "Ignoring unknown
#: escape sequences"). A warning that keeps the setting ("Special user nobody configured, this is
#: not safe!") is not one.
LOST_SETTING = re.compile(r"ignoring|failed to|invalid|cannot|can't|too long|out of range|bad ", re.I)


def unit_complaints(output: str, path: str) -> list[tuple[int, str]]:
    """(line, message) of each line of systemd's `output` (systemd-analyze verify, systemd --test)
    that says a setting of the unit file at `path` was lost; complaints about other files (the
    units it depends on) and about the unit as a whole (an executable missing here) are left out.
    systemd numbers a continued line by its last physical line."""
    located = re.compile(rf"^{re.escape(path)}:(\d+): (.*)$", re.M)
    return [(int(m[1]), m[2]) for m in located.finditer(output) if LOST_SETTING.search(m[2])]


def unit_digest(data: bytes) -> str:
    """Identifies a unit text; the same rule as orchestrator/plan.py Plan.digest."""
    return hashlib.sha256(data).hexdigest()[:16]


def unit_path(paths: dict, unit: str) -> str:
    return os.path.join(paths["unit_dir"], unit)


def facts_path(paths: dict, unit: str) -> str:
    """The UnitFacts of the installed unit (written by sglang_unit with it)."""
    return os.path.join(paths["state_dir"], "units", f"{unit}.json")


def record_path(paths: dict, unit: str) -> str:
    """The last unit that served healthy here (written by sglang_record)."""
    return os.path.join(paths["state_dir"], "last-good", f"{unit}.json")


def lock_path(paths: dict, unit: str) -> str:
    """The deploy lock; lock_dir is on tmpfs, so a reboot ends every deploy and its lock."""
    return os.path.join(paths["lock_dir"], f"{unit}.lock")


#: How every unit orchestrator writes begins (templates/sglang.service.j2's `ansible_managed`
#: line, orchestrator/plan.py MANAGED as a comment; tests/unit/modules prove they agree).
MANAGED_MARK = b"# Managed by orchestrator:"
#: What `systemctl show` tells of where a unit comes from (foreign_unit).
OWNER_PROPS = ("Id", "LoadState", "FragmentPath")


def foreign_unit(state: dict[str, str], paths: dict, unit: str) -> str:
    """Why `unit` is not orchestrator's to overwrite or stop on this host ('' when it is), from
    `systemctl show`'s OWNER_PROPS of it.

    Ours: a unit systemd does not know, or one it loads from our own file in unit_dir that carries
    MANAGED_MARK or has our facts (units/<unit>.json, which sglang_unit writes with every unit it
    installs). A unit file anywhere else (/lib/systemd/system/ssh.service, a generator's, another
    unit that `unit` is an alias of) would be overridden or shadowed by ours; a file in unit_dir
    with neither mark nor facts is someone's own. Masked units are foreign_write's."""
    ours = unit_path(paths, unit)
    fragment = state.get("FragmentPath", "")
    if fragment and os.path.normpath(fragment) != os.path.normpath(ours):
        real = state.get("Id", "")
        alias = f" as an alias of {real}" if real and real != unit else ""
        return f"{unit} is not orchestrator's: systemd loads it{alias} from {fragment}"
    data = read_bytes(ours)
    if data is not None and not data.startswith(MANAGED_MARK) and not os.path.exists(facts_path(paths, unit)):
        return (
            f"{unit} is not orchestrator's: {ours} has no '{MANAGED_MARK.decode()}' line and no facts in "
            f"{os.path.dirname(facts_path(paths, unit))}"
        )
    return ""


def foreign_write(state: dict[str, str], paths: dict, unit: str) -> str:
    """Why orchestrator may not write `unit`'s file ('' when it may): foreign_unit, or masked
    (a link to /dev/null, which the write would replace: someone wants it never to start)."""
    if state.get("LoadState") == "masked":
        where = state.get("FragmentPath") or unit_path(paths, unit)
        return f"{unit} is masked on this host ({where}): `systemctl unmask {unit}` if it is to run"
    return foreign_unit(state, paths, unit)


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def read_json(path: str) -> dict:
    """A JSON object from `path`; {} when it is absent, unreadable or not an object."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def deployed_units(paths: dict) -> dict[str, dict]:
    """Every unit orchestrator deployed on this host, as {unit: its stored facts}: sglang_unit
    writes units/<unit>.json with each unit it installs. Sorted by name."""
    folder = os.path.join(paths["state_dir"], "units")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    return {
        name.removesuffix(".json"): read_json(os.path.join(folder, name))
        for name in names
        if name.endswith(".json") and not name.startswith(".")  # not write_atomic's temporary files
    }


def installed_units(paths: dict) -> dict[str, dict]:
    """deployed_units whose unit file is still installed (a unit removed by hand leaves its
    facts behind: it runs no more, and takes no port)."""
    return {u: f for u, f in deployed_units(paths).items() if os.path.isfile(unit_path(paths, u))}


def write_atomic(path: str, data: bytes, mode: int) -> None:
    """Replace `path` with `data` (file mode `mode`) in one rename: a reader sees the old
    file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def ensure_attrs(module: Any, path: str, mode: int, changed: bool = False, owner: str = "root") -> bool:
    """`path` owned by `owner`:root with `mode`; whether anything changed (check mode aware)."""
    changed = module.set_mode_if_different(path, f"{mode:04o}", changed)
    changed = module.set_owner_if_different(path, owner, changed)
    return module.set_group_if_different(path, "root", changed)


def ensure_dir(module: Any, path: str, mode: int = 0o700) -> bool:
    """`path` a root-owned directory with `mode`; whether anything changed."""
    if os.path.isdir(path):
        return ensure_attrs(module, path, mode)
    if not module.check_mode:
        os.makedirs(path, mode=mode, exist_ok=True)
        ensure_attrs(module, path, mode)  # makedirs' mode is masked by the umask
    return True


def ensure_file(module: Any, path: str, data: bytes, mode: int, owner: str = "root") -> bool:
    """`path` holding exactly `data`, owned by `owner` with `mode`; whether anything changed."""
    if read_bytes(path) == data:
        return ensure_attrs(module, path, mode, owner=owner)
    if not module.check_mode:
        write_atomic(path, data, mode)  # a new file: the module's user, root
        if owner != "root":
            ensure_attrs(module, path, mode, owner=owner)
    return True


def _stale(current: dict, mine: dict) -> bool:
    """A lock taken from our own control machine by a process that no longer runs there is
    stale: its deploy died (killed, crashed) before releasing it."""
    same_control = current.get("control") and current.get("control") == mine.get("control")
    return bool(same_control) and current.get("pid") not in (mine.get("live_pids") or [])


def try_lock(path: str, mine: dict, record: dict | None = None) -> dict | None:
    """Take the lock atomically (O_EXCL), writing `record` (default `mine`); None when taken,
    else the current holder. An expired or stale lock, or one of this same run (a rollback
    after our own Ctrl-C), is taken over."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            current = read_json(path)
            ours = current.get("run_id") == mine.get("run_id")
            if current.get("expires", 0) > time.time() and not _stale(current, mine) and not ours:
                return current
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(record or mine, fh)
        return None
    return {"holder": "unknown (lock file keeps reappearing)"}


def acquire(module: Any, paths: dict, unit: str, lock: dict) -> None:
    """Wait up to lock's wait_s for the host's deploy lock, or fail naming who holds it."""
    now = time.time()
    mine = {**lock, "since": now, "expires": now + lock["ttl_s"]}
    record = {k: v for k, v in mine.items() if k != "live_pids"}
    deadline = time.monotonic() + lock["wait_s"]
    while True:
        holder = try_lock(lock_path(paths, unit), mine, record)
        if holder is None:
            return
        if time.monotonic() >= deadline:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
            module.fail_json(
                msg=f"another deploy holds this host: {holder.get('holder', '?')} since {since}, "
                f"deploying {holder.get('profile') or '?'} (waited {lock['wait_s']:.0f} s)",
                lock_holder=holder,
            )
        time.sleep(0.25)


def release_if_ours(paths: dict, unit: str, run_id: str) -> bool:
    """Remove the lock if `run_id` holds it; whether it was removed."""
    path = lock_path(paths, unit)
    if not run_id or read_json(path).get("run_id") != run_id:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


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


# --- containers ----------------------------------------------------------------------------------

#: The label a container unit puts on its container, naming the unit (orchestrator/container.py LABEL).
CONTAINER_LABEL = "orchestrator.unit"
#: The engines a unit may run SGLang with (orchestrator/container.py ENGINES).
ENGINES = ("docker", "podman")
#: `ps --format` per engine: podman writes one JSON array, docker one JSON object a line.
PS_FORMAT = {"docker": "{{json .}}", "podman": "json"}


def parse_ps(text: str) -> list[tuple[str, str]]:
    """(container ID, its orchestrator.unit label) of each container `ps` listed: podman's
    `--format json` (an array; Labels a map) or docker's `--format '{{json .}}'` (an object a
    line; Labels one `k=v,k=v` string, which a unit name, holding no ',', survives)."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    found = []
    for row in rows or []:
        labels = row.get("Labels") or {}
        if isinstance(labels, str):
            labels = dict(item.partition("=")[::2] for item in labels.split(","))
        cid, unit = row.get("Id") or row.get("ID") or "", labels.get(CONTAINER_LABEL, "")
        if cid and unit:
            found.append((cid, unit))
    return found


def proc_parents() -> dict[int, int]:
    """{PID: parent PID} of every process, from /proc/PID/stat (the command name, in
    parentheses, may hold spaces and parentheses: the fields follow the last ')')."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 1:
            parents[int(pid)] = int(fields[1])
    return parents


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def labelled_containers(module: Any) -> list[tuple[str, str, int]]:
    """(engine, unit label, main PID) of each running container labelled orchestrator.unit, of
    every engine installed here. An engine that is not installed is not asked; one that does not
    answer (docker without its daemon runs no container) or a container gone meanwhile is
    skipped: no host fails for lacking engines."""
    found = []
    for engine in ENGINES:
        exe = module.get_bin_path(engine)
        if not exe:
            continue
        argv = [exe, "ps", "--filter", f"label={CONTAINER_LABEL}", "--format", PS_FORMAT[engine]]
        rc, out, _ = module.run_command(argv)
        try:
            listed = parse_ps(out) if rc == 0 else []
        except ValueError:
            listed = []
        for cid, unit in listed:
            rc, out, _ = module.run_command([exe, "inspect", "--format", "{{.State.Pid}}", cid])
            pid = out.strip()
            if rc == 0 and pid.isdigit() and int(pid) > 0:
                found.append((engine, unit, int(pid)))
    return found


def container_units(
    module: Any, units: Collection[str], parents: Callable[[], dict[int, int]] | None = None
) -> dict[int, str]:
    """{PID: unit} of every process of a container labelled with one of `units`: its main PID
    (the engine's inspect) and all its descendants. A docker container runs under the daemon,
    outside its unit's cgroup, and so may a podman one (--cgroups=split puts it in a
    sub-cgroup, which cgroup_unit finds anyway); the label is what ties it to its unit. A
    container labelled with a unit this host does not know is nobody's, as in cgroups."""
    ours = [(unit, pid) for _, unit, pid in labelled_containers(module) if unit in units]
    if not ours:
        return {}
    tree = (parents or proc_parents)()
    return {p: unit for unit, pid in ours for p in descendants(pid, tree)}


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
    """GPU indexes as runs: [0, 1, 2, 3, 5] -> "0-3,5" (as orchestrator/view.py shows them)."""
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


# --- HTTP ----------------------------------------------------------------------------------------


def health_status(url: str, timeout: float) -> int | None:
    """The HTTP status of `url`; None when nothing answered (refused, timed out)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


# --- preflight -----------------------------------------------------------------------------------

#: EAGLE-1 style algorithms: an EAGLE-3 drafter under them runs with accept length 1.0.
EAGLE1 = ("EAGLE", "NEXTN")


def read_config(path: str) -> tuple[dict, str]:
    """A model directory's config.json, or an error saying what is wrong with the directory."""
    config = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        return {}, f"{path} does not exist"
    try:
        with open(config) as fh:
            return json.load(fh), ""
    except FileNotFoundError:
        return {}, f"{path} holds no config.json"
    except (OSError, ValueError) as exc:
        return {}, f"{config} is unreadable: {exc}"


def hidden_size(config: dict) -> int | None:
    """The target's hidden size: top level, or text_config for multimodal wrappers (Kimi-K2.5)."""
    return config.get("hidden_size") or (config.get("text_config") or {}).get("hidden_size")


def drafter_problems(algorithm: str, target: dict, draft: dict, draft_path: str) -> list[str]:
    archs = draft.get("architectures") or []
    eagle3 = any("Eagle3" in a for a in archs)
    problems = []
    if eagle3 and algorithm in EAGLE1:
        problems.append(
            f"drafter {draft_path} is an EAGLE-3 model ({', '.join(archs)}) but the algorithm is "
            f"{algorithm}: the server would start and silently run with accept length 1.0; "
            "use --speculative-algorithm EAGLE3"
        )
    elif algorithm == "EAGLE3" and archs and not eagle3:
        problems.append(
            f"drafter {draft_path} is not an EAGLE-3 model ({', '.join(archs)}) but the algorithm is EAGLE3; "
            "use an ...Eagle3 drafter or --speculative-algorithm EAGLE"
        )
    want, have = hidden_size(target), draft.get("target_hidden_size") or draft.get("hidden_size")
    if eagle3 and want and have and int(want) != int(have):
        problems.append(
            f"drafter {draft_path} expects target hidden size {have}, the target model has {want}"
        )
    return problems


def help_flags(help_text: str) -> set[str]:
    """The long options `sglang.launch_server --help` names."""
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))


def listeners(table_text: str, port: int) -> set[str]:
    """Socket inodes listening (state 0A) on `port` in a /proc/net/tcp or tcp6 text."""
    inodes = set()
    for row in table_text.splitlines()[1:]:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(cols[9])
    return inodes


def socket_owners(inodes: set[str]) -> list[int]:
    """PIDs holding one of these socket inodes open."""
    owners = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    owners.append(int(pid))
                    break
    return owners


def _named(unit: str, units: dict[str, dict]) -> str:
    """`sglang-a.service (profile cg_5tok)`: a unit with the profile its stored facts name."""
    return f"{unit} (profile {units.get(unit, {}).get('profile') or 'unknown'})"


def port_problems(
    port: int,
    unit_name: str,
    owners: list[tuple[int, str, str]],
    units: dict[str, dict],
    installed: Collection[str],
) -> list[str]:
    """Why `port` is not free for `unit_name`, one line each. First another installed
    orchestrator unit of this host whose facts say this port, running or enabled (started, it
    would take it): `installed` holds those; then who else listens on it now: `owners` are (PID, argv[0], the
    orchestrator unit it runs in or '') of the listening processes. Our own server may hold it.
    `units`: deployed_units, for the profiles."""
    clash = sorted(u for u in installed if u != unit_name and units.get(u, {}).get("port") == port)
    problems = [
        f"port {port} is the port of {_named(u, units)} on this host: give this profile another server.port"
        for u in clash
    ]
    neighbours: dict[str, list[str]] = {}
    foreign = []
    for pid, name, unit in owners:
        if unit != unit_name and unit not in clash:  # a clash is named once, above
            (neighbours.setdefault(unit, []) if unit else foreign).append(f"PID {pid} {name}")
    problems += [
        f"port {port} is taken by {', '.join(who)} of {_named(unit, units)}, another orchestrator unit "
        "on this host: give this profile another server.port"
        for unit, who in sorted(neighbours.items())
    ]
    if foreign:
        problems.append(f"port {port} is taken by {', '.join(foreign)} (not {unit_name})")
    return problems


def live_units(module: Any, units: list[str]) -> list[str]:
    """Those of `units` that run or start at boot: a unit `orchestrator stop` stopped and
    disabled takes its port no more."""
    if not units:
        return []
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, err = module.run_command([systemctl, "show", *units, "--property=Id,UnitFileState,ActiveState"])
    if rc != 0:
        module.fail_json(
            msg=f"systemctl show {' '.join(units)} failed: {' '.join((err or out).split())}", rc=rc
        )
    live = []
    for block in out.split("\n\n"):
        state = parse_systemctl_show(block)
        if state.get("UnitFileState") == "enabled" or state.get("ActiveState") in ("active", "activating"):
            live.append(state.get("Id", ""))
    return [u for u in units if u in live]


def port_owners(module: Any, port: int, units: Collection[str]) -> list[tuple[int, str, str]]:
    """(PID, argv[0], which of `units` it runs in or '') of each process listening on `port`: by
    its cgroup, else by its container (a container on the host network listens here too)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text = read_bytes(table)
        if text is not None:
            inodes |= listeners(text.decode(), port)
    if not inodes:
        return []
    owners = []
    for pid in socket_owners(inodes):
        name = argv0(pid)
        if name is not None:
            owners.append((pid, name, cgroup_unit(proc_cgroup(pid), units)))
    if any(not unit for _, _, unit in owners):
        containers = container_units(module, units)
        owners = [(pid, name, unit or containers.get(pid, "")) for pid, name, unit in owners]
    return owners


def user_problem(user: str) -> str:
    """The service user must exist: systemd fails the start with status 217/USER otherwise, after
    the running server was stopped, and its secret files could not be given to it."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return (
            f"service.user {user} does not exist on this host: create it (useradd --system {user}) "
            "or set another"
        )
    return ""


def disk_problem(log_dir: str, min_free_mib: int) -> str:
    try:
        stat = os.statvfs(log_dir)
    except OSError as exc:
        return f"log dir {log_dir}: {exc.strerror}"
    free_mib = stat.f_bavail * stat.f_frsize // 2**20
    return (
        f"{log_dir} has {free_mib} MiB free, the logs need {min_free_mib} MiB"
        if free_mib < min_free_mib
        else ""
    )


def _sglang_problems(module: Any, unit_name: str, paths: dict, c: dict) -> tuple[list[str], str, bool]:
    """(problems, installed version, whether --help was checked) for the unit's python."""
    python = c["python"]
    if not os.access(python, os.X_OK):
        return [f"python {python} does not exist or is not executable"], "", False
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    rc, out, err = module.run_command([python, "-c", code])
    if rc != 0:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return [f"SGLang is not importable by {python}: {tail}"], "", False
    version, problems = out.strip(), []
    if version != c["sglang_version"]:
        problems.append(
            f"SGLang {version} is installed, the profile renders flags for {c['sglang_version']}: "
            f'set server.sglang_version: "{version}" or install {c["sglang_version"]}'
        )
    installed = read_bytes(unit_path(paths, unit_name))
    if (
        c["skip_flags_if_digest"]
        and installed is not None
        and unit_digest(installed) == c["skip_flags_if_digest"]
    ):
        return problems, version, False  # this unit's flags already run here
    rc, out, err = module.run_command([python, "-m", "sglang.launch_server", "--help"])
    if rc != 0:
        tail = (err or out).strip()[-200:]
        return [*problems, f"`{python} -m sglang.launch_server --help` failed ({rc}): {tail}"], version, True
    known = help_flags(out)
    problems += [
        f"flag {flag} is not in this host's `sglang.launch_server --help` (SGLang {version})"
        for flag in c["flags"]
        if flag not in known
    ]
    return problems, version, True


# --- preflight in a container --------------------------------------------------------------------

#: The Debian package of each engine, for the problem that names it missing.
ENGINE_PACKAGES = {"docker": "docker.io", "podman": "podman"}
_VERSION_CODE = "import importlib.metadata as m; print(m.version('sglang'))"


def parse_image_inspect(text: str) -> dict:
    """`ENGINE image inspect IMAGE` (both engines print a JSON array) as {id, digests, labels}:
    the image ID without `sha256:` (docker writes it, podman does not), the registry digests it
    is known by, its labels. {} when the text is no such array."""
    try:
        rows = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        return {}
    row = rows[0]
    labels = (row.get("Config") or {}).get("Labels") or row.get("Labels") or {}
    return {
        "id": str(row.get("Id", "")).removeprefix("sha256:"),
        "digests": [d.rpartition("@")[2] for d in row.get("RepoDigests") or []],
        "labels": labels,
    }


def label_version(labels: dict) -> str:
    """The SGLang version an image's labels state, '' when they do not. `sglang.version` says it;
    org.opencontainers.image.version only where the image's title is SGLang's, since a label is
    inherited: a CUDA image built on Ubuntu carries Ubuntu's (22.04)."""
    if labels.get("sglang.version"):
        return str(labels["sglang.version"])
    if "sglang" in str(labels.get("org.opencontainers.image.title", "")).lower():
        return str(labels.get("org.opencontainers.image.version", ""))
    return ""


def image_cache_path(paths: dict, image_id: str) -> str:
    """What preflight learnt from one image (its SGLang version and --help flags), by image ID:
    an image's bytes never change, so one look serves every later deploy."""
    return os.path.join(paths["state_dir"], "images", f"{image_id}.json")


def _engine(module: Any, engine: str) -> tuple[str, str]:
    """(the engine's path, '') when it is installed and answers `ENGINE version`; else ('', problem)."""
    exe = module.get_bin_path(engine)
    if not exe:
        return "", (
            f"{engine} is not installed on this host (runtime.kind: {engine}): install it "
            f"(apt-get install {ENGINE_PACKAGES[engine]}) or set another runtime.kind"
        )
    rc, out, err = module.run_command([exe, "version"])
    if rc != 0:
        # docker's client answers only with its daemon; podman has none, so its set-up is at fault.
        fix = "start the daemon (systemctl start docker)" if engine == "docker" else "see `podman info`"
        return "", f"`{engine} version` exited {rc}: {_tail(out, err)}: {fix}"
    return exe, ""


def _in_image(module: Any, exe: str, image_id: str, c: dict, argv: list[str]) -> tuple[int, str, str]:
    """`argv` in a throw-away container of the image we inspected, by its ID (no other image can
    answer), without GPUs, mounts or a pull, with the unit's own engine options `run_options`
    (network, cgroups, ulimits: what the host allows a container)."""
    run = [exe, "run", "--rm", "--pull=never", *c["run_options"], image_id, *argv]
    return module.run_command(run)


def _tail(out: str, err: str) -> str:
    return ((err or out).strip().splitlines() or ["no output"])[-1][-200:]


def _inspect_image(module: Any, exe: str, c: dict) -> tuple[dict, list[str], list[str]]:
    """(the image as parse_image_inspect reads it, problems, notes): {} when it is not here,
    which is a problem only with runtime.pull never; preflight never pulls."""
    engine, ref, pull = c["engine"], c["image"], c["pull"]
    rc, out, _ = module.run_command([exe, "image", "inspect", ref])
    image = parse_image_inspect(out) if rc == 0 else {}
    if image.get("id"):
        if pull != "always" or "@" in ref:
            return image, [], []
        moved = (
            f"image {ref} is checked as it is here, but runtime.pull always pulls its tag again at "
            "start: pin it by digest (IMAGE:TAG@sha256:...) so that what runs is what was checked"
        )
        return image, [], [moved]
    if pull == "never":
        missing = (
            f"image {ref} is not on this host and runtime.pull is never: pull it ({engine} pull {ref}) "
            "or set runtime.pull: missing"
        )
        return {}, [missing], []
    pulled = (
        f"image {ref} is not on this host: {engine} pulls it when the unit starts (runtime.pull: "
        f"{pull}); its SGLang version and flags are checked by the next preflight"
    )
    return {}, [], [pulled]


def _image_flags(module: Any, exe: str, image_id: str, c: dict) -> tuple[list[str] | None, list[str]]:
    """(the long options of the image's own `sglang.launch_server --help`, or None and why not)."""
    python, ref = c["python"], c["image"]
    rc, out, err = _in_image(module, exe, image_id, c, [python, "-m", "sglang.launch_server", "--help"])
    if rc != 0:
        return None, [
            f"`{python} -m sglang.launch_server --help` failed in image {ref} ({rc}): {_tail(out, err)}"
        ]
    return sorted(help_flags(out)), []


def _image_problems(
    module: Any, unit_name: str, paths: dict, c: dict
) -> tuple[list[str], str, bool, list[str]]:
    """(problems, the image's SGLang version, whether --help was checked, notes) for a container
    runtime: the engine answers, the image is here (or will be pulled), and its own SGLang and
    `--help`, not the host's, take the plan's version and flags. Both answers are cached by
    image ID under the state dir (image_cache_path), so later deploys start no container."""
    ref, python = c["image"], c["python"]
    exe, problem = _engine(module, c["engine"])
    if problem:
        return [problem], "", False, []
    image, problems, notes = _inspect_image(module, exe, c)
    if c["run_words"]:
        problems += _created_problems(module, exe, c, image.get("id", ""))
    majors = nvidia_majors(_proc_devices())
    problems += device_problems(c["run_words"], c["mounts"], majors, missing=c["engine"] == "docker")
    if not image:
        return problems, "", False, notes
    cache_file = image_cache_path(paths, image["id"])
    cached = read_json(cache_file)
    version = cached.get("sglang_version") or label_version(image["labels"])
    if not version:
        rc, out, err = _in_image(module, exe, image["id"], c, [python, "-c", _VERSION_CODE])
        if rc != 0:
            problems.append(f"SGLang is not importable by {python} in image {ref}: {_tail(out, err)}")
            return problems, "", False, []
        version = out.strip()
    if version != c["sglang_version"]:
        problems.append(
            f"image {ref} has SGLang {version}, the profile renders flags for {c['sglang_version']}: "
            f'set server.sglang_version: "{version}" or use an image with {c["sglang_version"]}'
        )
    learnt = {**cached, "image": image["id"], "sglang_version": version}
    installed = read_bytes(unit_path(paths, unit_name))
    running = installed is not None and unit_digest(installed) == c["skip_flags_if_digest"]
    help_checked = not (c["skip_flags_if_digest"] and running)  # else this unit's flags already run here
    if help_checked:
        flags = cached.get("flags")
        if not isinstance(flags, list):
            flags, more = _image_flags(module, exe, image["id"], c)
            problems += more
        if flags is not None:
            learnt["flags"] = flags
            problems += [
                f"flag {flag} is not in the `sglang.launch_server --help` of image {ref} (SGLang {version})"
                for flag in c["flags"]
                if flag not in flags
            ]
    if learnt != cached and not module.check_mode:  # check mode changes nothing, not even a cache
        os.makedirs(os.path.dirname(cache_file), mode=0o700, exist_ok=True)
        write_atomic(cache_file, json.dumps(learnt, sort_keys=True).encode(), 0o600)
    return problems, version, help_checked, notes


# --- the engine's own reading of the unit's run command -----------------------------------------

#: The label a preflight container carries in place of CONTAINER_LABEL, so that nothing that
#: looks for the unit's container (GPU and port owners, verify) takes it for that.
PREFLIGHT_LABEL = "orchestrator.preflight"
#: `run` words that a `create` beside the running server leaves out: -d (create starts nothing)
#: and podman's --replace, which would remove the running server's container of that name.
_RUN_ONLY = ("-d", "--replace")


def create_words(run_words: list[str], name: str, image: list[str], replaced: dict[str, str]) -> list[str]:
    """The unit's `run` words (after `ENGINE run`, as systemd runs them) as the words of a
    `create` that judges every option and leaves the unit's own things alone: its own `name`
    and label, never a pull, `image` in place of the image, and each host path in `replaced`
    (the secret files, sources that are missing) swapped as a --volume source or --env-file.
    Everything else, SGLang's argv after the image included, is the unit's word for word."""
    at = next(i for i, w in enumerate(run_words) if not w.startswith("-"))
    words = []
    for word in run_words[:at]:
        flag, _, value = word.partition("=")
        source, colon, rest = value.partition(":")
        if word in _RUN_ONLY:
            continue
        if flag == "--name":
            word = f"--name={name}"
        elif flag == "--label" and value.startswith(CONTAINER_LABEL + "="):
            word = f"--label={PREFLIGHT_LABEL}={value.partition('=')[2]}"
        elif flag == "--pull":
            word = "--pull=never"
        elif flag == "--env-file" and value in replaced:
            word = f"--env-file={replaced[value]}"
        elif flag == "--volume" and colon and source in replaced:
            word = f"--volume={replaced[source]}:{rest}"
        words.append(word)
    return [*words, *image, *run_words[at + 1 :]]


def engine_message(out: str, err: str) -> str:
    """The engine's one line about a refusal: podman's `Error: ...`, docker's `docker: Error
    response from daemon: ...` (before its `See 'docker create --help'.`)."""
    lines = [line.strip() for line in (err or out).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("See '", "Run '"))] or ["no output"]
    message = lines[-1]
    for prefix in ("docker: ", "Error: ", "Error response from daemon: "):
        message = message.removeprefix(prefix)
    return message[:300]


def refused_words(message: str, words: list[str]) -> list[str]:
    """The unit's options an engine's refusal is about: those whose value it quotes whole, else
    those with a part (between ':', '=' or ',') that is a word of it: a mode (`invalid device
    mode: mmm`), a path, compared as the engines clean it (`"/data/m": duplicate mount
    destination` for `--volume=/a:/data/m/.`)."""
    options = [w for w in words if w.startswith("--") and "=" in w]
    named = [
        w
        for w in options
        if re.search(rf"(?:^|[\s\"'(]){re.escape(w.partition('=')[2])}(?:$|[\s\"'),:;])", message)
    ]
    if named:
        return named
    said = {_cleaned(t.strip("\"'.,:;()")) for t in message.split()}
    return [w for w in options if said & {_cleaned(p) for p in re.split("[:=,]", w.partition("=")[2])}]


def _cleaned(part: str) -> str:
    return os.path.normpath(part) if part.startswith("/") else part


def _created_problems(module: Any, exe: str, c: dict, image_id: str) -> list[str]:
    """The engine's own parse of the whole run command before the stop: `create` (never
    started) of the unit's words as create_words makes them, then `rm`, whatever happened.
    podman creates over an empty root file system in the image's place (`--rootfs`: no copy of
    the image's layers, which the vfs driver would make); docker, which has no such option,
    from the image (absent: it verifies every option before it says "No such image"). The
    secret files are empty ones here, so no secret reaches a container's stored config. In check
    mode too, as the throw-away `run --rm`: nothing of it outlives the check."""
    run_words, engine = c["run_words"], c["engine"]
    base = next((w.partition("=")[2] for w in run_words if w.startswith("--name=")), "orchestrator")
    name = f"{base}-preflight-{os.urandom(6).hex()}"  # never the server's container, nor another preflight's
    folder = tempfile.mkdtemp(prefix="orchestrator-create-")
    try:
        replaced = {}
        for i, path in enumerate(c["secret_files"]):
            replaced[path] = os.path.join(folder, f"secret-{i}")
            os.close(os.open(replaced[path], os.O_WRONLY | os.O_CREAT, 0o600))
        for word in run_words:
            source = word.partition("=")[2].partition(":")[0] if word.startswith("--volume=") else ""
            if source and source not in replaced and not os.path.exists(source):
                replaced[source] = tempfile.mkdtemp(dir=folder)  # named missing by its own check
        if engine == "podman":
            os.mkdir(os.path.join(folder, "rootfs"))
            image = ["--rootfs", os.path.join(folder, "rootfs")]
        else:
            image = [image_id or c["image"]]
        words = create_words(run_words, name, image, replaced)
        rc, out, err = module.run_command([exe, "create", *words])
    finally:
        module.run_command([exe, "rm", "-f", *(["--ignore"] if engine == "podman" else []), name])
        shutil.rmtree(folder, ignore_errors=True)
    if rc == 0 or (engine == "docker" and not image_id and "No such image" in err):
        return []
    message = engine_message(out, err)
    named = refused_words(message, words)
    where = f" ({', '.join(named)})" if named else ""
    return [
        f"{engine} refuses the unit's run command: {message}{where}, said by its own `{engine} create` "
        "before the stop: fix the profile's value"
    ]


#: /proc/devices names NVIDIA's drivers' character majors: nvidia (195: GPUs and nvidiactl),
#: nvidia-uvm, nvidia-caps, nvidia-nvswitch..., all but 195 allocated at load time.
NVIDIA_MAJOR = 195


def nvidia_majors(proc_devices: str) -> set[int]:
    """The character-device majors of NVIDIA's drivers in /proc/devices' text; 195 always."""
    majors, char = {NVIDIA_MAJOR}, False
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            char = line == "Character devices:"
            continue
        number, _, driver = line.strip().partition(" ")
        if char and driver.startswith("nvidia") and number.isdecimal():
            majors.add(int(number))
    return majors


#: How many entries of a directory are looked through for an NVIDIA device node.
DEVICE_WALK_LIMIT = 10000


def nvidia_nodes(path: str, majors: set[int], walk: bool = True) -> list[str]:
    """NVIDIA device nodes `path` gives a container, as the engines resolve it: the node its
    links lead to, or with `walk` every node of the directory they lead to (the engines hand a
    directory's nodes over, its links not followed). [] when it is none or cannot be read."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return []
    if stat.S_ISCHR(st.st_mode):
        return [real] if os.major(st.st_rdev) in majors else []
    if not (walk and stat.S_ISDIR(st.st_mode)):
        return []
    found, seen = [], 0
    for top, dirs, files in os.walk(real):
        for entry in (*dirs, *files):
            seen += 1
            if seen > DEVICE_WALK_LIMIT:
                return [*found, f"{real} (more than {DEVICE_WALK_LIMIT} entries, not all looked at)"]
            full = os.path.join(top, entry)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in majors:
                found.append(full)
    return sorted(found)


def device_problems(
    run_words: list[str], sources: list[str], majors: set[int], missing: bool = False
) -> list[str]:
    """What the container would get of NVIDIA's devices beside server.gpus, through links and
    directories the control machine cannot see: a --device host path (`/dev/gpu0` a link to
    nvidia0), or a mount source under /dev (its directories walked; a model cache elsewhere is
    not). With `missing`, a --device host path this host lacks too: docker's daemon looks at
    devices only when the container starts, after the stop (podman's create says so itself)."""
    problems = []
    for word in run_words:
        host = word.partition("=")[2].partition(":")[0] if word.startswith("--device=") else ""
        nodes = nvidia_nodes(host, majors) if host.startswith("/") else []
        if missing and host.startswith("/") and not os.path.exists(host):
            problems.append(f"{word}: {host} does not exist on this host: drop it from runtime.options")
        if nodes:
            problems.append(
                f"{word} gives the container {', '.join(nodes[:4])} on this host, NVIDIA's: GPUs reach "
                "the container from server.gpus only; drop it from runtime.options"
            )
    for source in sources:
        real = os.path.realpath(source)
        nodes = nvidia_nodes(source, majors, walk=real == "/dev" or real.startswith("/dev/"))
        if nodes:
            problems.append(
                f"runtime.mounts source {source} gives the container {', '.join(nodes[:4])} on this host, "
                "NVIDIA's: GPUs reach the container from server.gpus only; mount no device paths"
            )
    return problems


def _proc_devices() -> str:
    try:
        with open("/proc/devices") as fh:
            return fh.read()
    except OSError:
        return ""


def mount_problems(sources: list[str]) -> list[str]:
    """runtime.mounts whose host path is missing: podman refuses to start the container, and
    docker makes an empty directory in its place (a model cache that is silently empty)."""
    return [
        f"runtime.mounts source {src} does not exist on this host: create it or fix the path "
        "(podman would not start; docker would mount an empty directory made in its place)"
        for src in sources
        if not os.path.exists(src)
    ]


def _model_problems(c: dict) -> list[str]:
    target, error = read_config(c["model_path"])
    problems = [f"model path: {error}"] if error else []
    if c["draft_model_path"]:
        draft, error = read_config(c["draft_model_path"])
        if error:
            problems.append(f"draft model path: {error}")
        elif c["algorithm"]:
            problems += drafter_problems(c["algorithm"], target, draft, c["draft_model_path"])
    return problems


def gpu_set_problems(
    gpus: list[dict],
    apps: list[dict],
    wanted: list[int],
    unit_name: str,
    units: dict[str, dict],
    allow_foreign: bool,
) -> list[str]:
    """What stands between `unit_name` and its GPU set (`wanted`), one line each: GPUs the host
    lacks; a process of another orchestrator unit of this host on one of them (never killed:
    the deploy cannot go on); any other process outside our unit, unless the deploy kills it
    (allow_foreign). GPUs outside the set are not looked at: another server may use them.
    `apps` carry their `unit` (with_units); `units`: deployed_units, for the profiles."""
    missing = missing_gpus(wanted, gpus)
    problems = [missing] if missing else []
    others = [a for a in apps if a["gpu"] in wanted and a["unit"] != unit_name]
    neighbours: dict[str, list[dict]] = {}
    for a in others:
        if a["unit"]:
            neighbours.setdefault(a["unit"], []).append(a)
    for unit, held in sorted(neighbours.items()):
        who = ", ".join(dict.fromkeys(f"PID {_mib(a['pid'])} {a['process_name']}" for a in held))
        problems.append(
            f"{_gpus_are(sorted({a['gpu'] for a in held}))} used by {who} of {_named(unit, units)}, another "
            f"orchestrator unit on this host: give this profile other server.gpus or stop {unit}"
        )
    if not allow_foreign:
        for b in foreign_gpus(gpus, [a for a in others if not a["unit"]], wanted, unit_name):
            for h in b["holders"]:  # one line per process, as --kill-gpu-holders would kill it
                who = describe([{**b, "holders": [h]}], foreign_only=True)
                problems.append(f"{who}, outside {unit_name} (--kill-gpu-holders kills it)")
    return problems


def _gpu_problems(module: Any, unit_name: str, units: dict[str, dict], c: dict) -> tuple[list[str], int]:
    gpus, apps, error = query_nvidia_smi(module, c["nvidia_smi"])
    if error:
        return [error], 0
    apps = owned_apps(module, apps, {*units, unit_name})
    return gpu_set_problems(gpus, apps, c["gpus"], unit_name, units, c["allow_gpu_holders"]), len(gpus)


def verify_unit(module: Any, unit_name: str, data: bytes, folder: str | None = None) -> tuple[str, str]:
    """(path, complaint) of `systemd-analyze verify` on the unit text, written as a 0644 file
    named like the unit (systemd-analyze needs the suffix) in `folder`, else in a private
    temporary directory. The complaint is "" when systemd accepts it and uses every setting
    (a non-zero exit, or a line it ignores: unit_complaints); the file is left for the caller
    (to rename into place), removed with its private directory otherwise."""
    private = folder is None
    folder = folder or tempfile.mkdtemp(prefix="orchestrator-verify-")
    stem, suffix = os.path.splitext(unit_name)
    fd, path = tempfile.mkstemp(prefix=f".{stem}-" if not private else "", suffix=suffix, dir=folder)
    if private:
        os.close(fd)
        path = os.path.join(folder, unit_name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o644)
        fh.write(data)
    analyze = module.get_bin_path("systemd-analyze", required=True)
    rc, out, err = module.run_command([analyze, "verify", path])
    if rc == 0:  # loaded, but a setting systemd ignores is an error too: the unit would run without it
        lost = unit_complaints(out + err, path)
        complaint = "; ".join(f"{unit_name}:{line}: {message}" for line, message in lost)
    else:
        complaint = (out + err).replace(path, unit_name).strip()
        complaint = complaint.replace(os.path.basename(path), unit_name)
    if private:
        shutil.rmtree(folder, ignore_errors=True)
    elif complaint:
        os.unlink(path)
    return path, complaint


def _unit_problems(module: Any, unit_name: str, paths: dict, c: dict) -> tuple[list[str], str]:
    """systemd-analyze's verdict on the planned unit before anything stops, not after; skipped
    when that very unit is installed (it runs). (problems, digest verified)."""
    if not c["unit_content"]:
        return [], ""
    data = c["unit_content"].encode()
    installed = read_bytes(unit_path(paths, unit_name))
    if installed is not None and installed == data:
        return [], ""
    _, complaint = verify_unit(module, unit_name, data)
    if complaint:
        return [f"systemd-analyze verify refuses the planned {unit_name}: {complaint}"], ""
    return [], unit_digest(data)


def preflight_checks(module: Any, unit_name: str, paths: dict, checks: dict) -> dict:
    """Everything that can be known before a stop, read-only: that the unit is ours to replace
    (foreign_write: not ssh.service, nor a masked one), SGLang's version and flags (the
    host's Python's, or in a container runtime the engine, the image and the image's own SGLang),
    the unit as systemd reads it, the model and drafter (a container gets them mounted read-only
    at the same paths, so the host's files are the container's), our GPU set and its holders
    (another orchestrator unit of this host named as such, a container's processes by its
    label), the port (another unit's included), disk for logs. Every problem at once, one line
    each: {problems, notes, sglang_version, gpus, help_checked, verified_digest}; notes say what
    could not be checked yet (an image to be pulled) without failing."""
    problems, verified = _unit_problems(module, unit_name, paths, checks)
    state, failed = try_systemctl_show(module, unit_name, OWNER_PROPS)
    foreign = failed or foreign_write(state, paths, unit_name)  # every other check still runs
    if foreign:
        fix = "" if failed else "; a deploy would replace it: choose another service.unit_name"
        problems.insert(0, foreign + fix)
    notes: list[str] = []
    if checks["engine"]:
        more, version, help_checked, notes = _image_problems(module, unit_name, paths, checks)
    else:
        more, version, help_checked = _sglang_problems(module, unit_name, paths, checks)
    problems += more
    problems += _model_problems(checks)
    problems += mount_problems(checks["mounts"])
    units = deployed_units(paths)
    gpu_problems, gpus = _gpu_problems(module, unit_name, units, checks)
    problems += gpu_problems
    owners = port_owners(module, checks["port"], {*units, unit_name})
    same_port = [u for u in installed_units(paths) if units[u].get("port") == checks["port"]]
    problems += port_problems(checks["port"], unit_name, owners, units, live_units(module, same_port))
    disk = disk_problem(checks["log_dir"], checks["min_free_mib"])
    if disk:
        problems.append(disk)
    user = user_problem(checks["user"])
    if user:
        problems.append(user)
    return {
        "problems": problems,
        "notes": notes,
        "sglang_version": version,
        "gpus": gpus,
        "help_checked": help_checked,
        "verified_digest": verified,
    }
