"""Servers started by hand (issue 42): each SGLang server of the host found in /proc (its argv,
environment, launcher, ports and GPUs; a container's command from its engine), one taken over
(its command saved under the state directory, its process tree stopped), and that command
started again as it ran (relaunch).

Secrets never leave the host: a secret flag's or variable's value reads `<secret>`, with its
sha256 beside it. The saved command keeps them, in a root 0600 file.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pwd
import re
import signal
import stat
import subprocess
import time
from typing import TYPE_CHECKING, Any

from . import procs
from .containers import descendants
from .files import ensure_dir, read_bytes, read_json, write_atomic
from .gpus import query_nvidia_smi
from .health import health_status
from .options import PATHS_SPEC
from .procs import proc_stat, start_ticks
from .units import deployed_units

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.gpus
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.health
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401

#: SGLang's flags whose value is a secret: at least the control machine's
#: (orchestrator/profile/sglang_flags.py SECRET_FLAGS; a test holds them together).
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
#: A variable whose name holds one of these (in any case) is a secret: the control machine's
#: rule (orchestrator/profile/sglang_rules.py SECRET_NAME_PARTS; a test holds them equal).
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
#: SGLang's flags that a secret flag begins with. argparse takes an exact flag first, so
#: `--ssl-keyfile PATH` is no secret, and a shorter prefix is ambiguous: argparse refuses it.
PLAIN_FLAGS = ("--ssl-keyfile",)
SECRET = "<secret>"
#: A value longer than this is left out of what find returns: no profile holds it.
MAX_VALUE = 64 * 1024
#: The shells a server's parent may be (its comm).
SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "mksh", "fish")
#: How a container's cgroup names it: docker's (systemd or cgroupfs driver), podman's.
CONTAINER_CGROUP = (
    ("docker", re.compile(r"docker[-/]([0-9a-f]{64})")),
    ("podman", re.compile(r"libpod-(?:payload-)?([0-9a-f]{64})")),
)
_VERSION_CODE = "import importlib.metadata as m; print(m.version('sglang'))"
#: The version probe's whole environment: nothing of the server's.
PROBE_ENV = {"PATH": "/usr/bin:/bin"}
#: How long the server's python may take to say its SGLang version.
VERSION_TIMEOUT_S = 30.0

ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "nvidia_smi": {"type": "str", "default": "nvidia-smi", "description": "The nvidia-smi executable."},
    "engines": {
        "type": "list",
        "elements": "str",
        "default": ["docker", "podman"],
        "description": "The container engines asked about a server in a container; another is not asked.",
    },
    "engine_timeout_s": {
        "type": "float",
        "default": 10.0,
        "description": "Seconds a container engine may take to answer; then the server is read from /proc.",
    },
}

#: The options of sglang_restart's takeover step.
TAKEOVER_SPEC: dict[str, dict[str, Any]] = {
    "pid": {"type": "int", "required": True, "description": "The hand-started server's PID."},
    "start_ticks": {
        "type": "int",
        "required": True,
        "description": (
            "Its start time, field 22 of /proc/PID/stat: a PID that started at another time is "
            "another process, never stopped."
        ),
    },
    "unit_name": {
        "type": "str",
        "required": True,
        "description": "The unit that takes over; its stem names the saved command.",
    },
    "paths": {
        **PATHS_SPEC,
        "description": (
            "Where orchestrator keeps things on the host; the command is saved under C(state_dir)/adopted."
        ),
    },
    "gone_timeout_s": {
        "type": "float",
        "default": 30.0,
        "description": "Seconds to wait after SIGTERM for the process tree to exit; then SIGKILL.",
    },
}


class Gone(Exception):
    """The process exited (or its PID went to another one) while it was read."""


# --- /proc ---------------------------------------------------------------------------------------


def boot_time() -> float:
    for line in (read_bytes("/proc/stat") or b"").decode().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def walk() -> dict[int, dict[str, Any]]:
    """Every live process: {PID: {ppid, comm, ticks, argv (bytes words)}}. Kernel threads (no
    argv) and zombies are left out. One pass over /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        read, cmdline = proc_stat(pid), read_bytes(f"/proc/{pid}/cmdline")
        if read is None or not cmdline or len(read[1]) < 20 or read[1][0] in ("Z", "X"):
            continue
        table[pid] = {
            "ppid": int(read[1][1]),
            "comm": read[0],
            "ticks": int(read[1][19]),
            "argv": cmdline.split(b"\0")[:-1] if cmdline.endswith(b"\0") else cmdline.split(b"\0"),
        }
    return table


def status_fields(pid: int) -> dict[str, str]:
    """/proc/PID/status as {field: value}; raises Gone when the process is gone."""
    data = read_bytes(f"/proc/{pid}/status")
    if data is None:
        raise Gone(pid)
    fields = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, _colon, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _readlink(pid: int, name: str) -> str:
    """A /proc/PID link's target; raises Gone when the process is gone."""
    try:
        return os.readlink(f"/proc/{pid}/{name}")
    except FileNotFoundError:
        raise Gone(pid) from None
    except OSError:
        return ""


def log_file(pid: int, fd: int) -> str:
    """Where fd `fd` writes, when that is a regular file ('' otherwise: a pipe, a tty)."""
    try:
        if not stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode):
            return ""
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


def children(table: dict[int, dict[str, Any]]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for pid, proc in table.items():
        found.setdefault(proc["ppid"], []).append(pid)
    return found


def tree(pid: int, table: dict[int, dict[str, Any]]) -> set[int]:
    """`pid` and every process below it."""
    return descendants(pid, {p: proc["ppid"] for p, proc in table.items()})


# --- SGLang's processes ---------------------------------------------------------------------------


def _base(word: bytes) -> bytes:
    return word.rpartition(b"/")[2]


def python_module(argv: list[bytes]) -> bytes | None:
    """The module `python [options] -m MODULE ...` runs; None for a script, `-c` or stdin. The
    interpreter's own options come first (`-u`, `-X dev`, `-W error`, `-Bm`)."""
    i = 1
    while i < len(argv):
        word = argv[i]
        if not word.startswith(b"-") or word == b"-":
            return None
        if word.startswith(b"--"):
            i += 2 if word == b"--check-hash-based-pycs" else 1
            continue
        flags = word[1:]
        for j in range(len(flags)):
            letter = flags[j : j + 1]
            if letter == b"m":
                rest = flags[j + 1 :]
                return rest or (argv[i + 1] if i + 1 < len(argv) else None)
            if letter == b"c":
                return None
            if letter in (b"X", b"W"):
                i += 0 if flags[j + 1 :] else 1  # its value is the next word
                break
        i += 1
    return None


def sglang_entry(argv: list[bytes]) -> str:
    """How `argv` runs SGLang's server: `module` (python -m sglang.launch_server), `serve`
    (`sglang serve`, or the console script run by its interpreter: a `#!` line gives
    [python, /venv/bin/sglang, serve, ...]), or '' when it is no SGLang server."""
    if len(argv) > 1 and _base(argv[0]) == b"sglang" and argv[1] == b"serve":
        return "serve"
    if len(argv) > 2 and _base(argv[0]).startswith(b"python") and _base(argv[1]) == b"sglang":
        return "serve" if argv[2] == b"serve" else ""
    return "module" if python_module(argv) == b"sglang.launch_server" else ""


def servers_of(table: dict[int, dict[str, Any]]) -> dict[int, str]:
    """{PID: entry} of the SGLang servers: a process whose argv runs one, and none of whose
    ancestors does (SGLang's schedulers may be forked from it, argv and all)."""
    matched = {pid: sglang_entry(proc["argv"]) for pid, proc in table.items()}
    found = {}
    for pid, entry in matched.items():
        if not entry:
            continue
        parent, seen = table[pid]["ppid"], {pid}
        while parent in table and parent not in seen and not matched.get(parent):
            seen.add(parent)
            parent = table[parent]["ppid"]
        if not matched.get(parent):
            found[pid] = entry
    return found


def server_of(pid: int, table: dict[int, dict[str, Any]], servers: dict[int, str]) -> int:
    """The SGLang server `pid` runs under (0: none)."""
    parent, seen = table.get(pid, {}).get("ppid", 0), {pid}
    while parent in table and parent not in seen:
        if parent in servers:
            return parent
        seen.add(parent)
        parent = table[parent]["ppid"]
    return 0


# --- what a person may read: text, secrets ---------------------------------------------------------


def text(data: bytes) -> tuple[str, bool]:
    """`data` as text, and whether it was UTF-8 (else its other bytes read as \\xNN)."""
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", "backslashreplace"), False


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def size(n: int) -> str:
    """A size as a person reads it: 3.1 MB, 98 kB."""
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def secret_flag(word: str) -> str:
    """The secret flag `word` spells ('' for none): the flag, `--flag=VALUE`, or a prefix of it
    that argparse takes for it (`--api-k`)."""
    name = word.partition("=")[0]
    if len(name) < 3 or not name.startswith("--") or any(p.startswith(name) for p in PLAIN_FLAGS):
        return ""
    return next((flag for flag in SECRET_FLAGS if flag.startswith(name)), "")


def redact_argv(words: list[str], raw: list[bytes]) -> tuple[list[str], dict[str, str]]:
    """`words` with each secret flag's value replaced by SECRET, and {flag: sha256 of its value}."""
    out, secrets = list(words), {}
    i = 1
    while i < len(out):
        flag = secret_flag(out[i])
        if flag and "=" in out[i]:
            secrets[flag] = digest(raw[i].partition(b"=")[2])
            out[i] = f"{out[i].partition('=')[0]}={SECRET}"
        elif flag and i + 1 < len(out):
            secrets[flag] = digest(raw[i + 1])
            out[i + 1] = SECRET
            i += 1
        i += 1
    return out, secrets


def secret_name(name: str) -> bool:
    """Whether a variable holds a secret: its name holds TOKEN, KEY, SECRET or PASSWORD, in any case."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def read_argv(pid: int, raw: list[bytes]) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv as text with its secrets redacted, {flag: sha256}, problems)."""
    words, problems = [], []
    for i, word in enumerate(raw):
        said, utf8 = text(word)
        if not utf8:
            problems.append(f"PID {pid}: argv word {i} is not UTF-8: a profile cannot hold it")
        if len(word) > MAX_VALUE:
            problems.append(f"PID {pid}: argv word {i} is {size(len(word))}: it is left out")
            said = f"<left out: {size(len(word))}>"
        words.append(said)
    out, secrets = redact_argv(words, raw)
    return out, secrets, problems


def parse_environ(data: bytes) -> list[tuple[bytes, bytes]]:
    """/proc/PID/environ as (name, value) pairs, in order; the first of a name wins, as getenv's."""
    pairs, seen = [], set()
    for entry in data.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq and name not in seen:
            seen.add(name)
            pairs.append((name, value))
    return pairs


def read_env(pid: int, pairs: list[tuple[bytes, bytes]]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(environment as text, secrets redacted, {name: sha256}, problems)."""
    env, secrets, problems = {}, {}, []
    total = sum(len(n) + len(v) + 2 for n, v in pairs)
    for raw_name, raw_value in pairs:
        name, name_ok = text(raw_name)
        value, value_ok = text(raw_value)
        if not (name_ok and value_ok):
            problems.append(f"PID {pid}: variable {name} is not UTF-8: a profile cannot hold it")
        if len(raw_value) > MAX_VALUE:
            problems.append(
                f"PID {pid}: its environment is {size(total)}; {name} ({size(len(raw_value))}) is left out"
            )
            continue
        if secret_name(name):
            secrets[name] = digest(raw_value)
            value = SECRET
        env[name] = value
    return env, secrets, problems


# --- where a process runs: its unit, its container, its launcher -------------------------------------


def cgroup_path(cgroup_text: str) -> str:
    """The process's cgroup: cgroup v2's, else the name=systemd hierarchy's (v1)."""
    paths = {}
    for line in cgroup_text.splitlines():
        hierarchy, _colon, rest = line.partition(":")
        controllers, _colon, path = rest.partition(":")
        if hierarchy == "0" or controllers == "name=systemd":
            paths[controllers or "v2"] = path
    v2 = paths.get("v2", "")
    return v2 if v2 not in ("", "/") else paths.get("name=systemd", v2)


def cgroup_unit_name(cgroup_text: str) -> str:
    """The systemd unit a process runs in, by its cgroup: the innermost .service or .scope
    ('_cpu.service' unescaped); '' for a login session's scope, init.scope or none."""
    for part in reversed(cgroup_path(cgroup_text).split("/")):
        if part.endswith((".service", ".scope")):
            unit = part[1:] if part.startswith("_") else part
            return "" if unit.startswith("session-") or unit == "init.scope" else unit
    return ""


def owning_unit(module: Any, pid: int, table: dict[int, dict[str, Any]], cgroup_text: str) -> str:
    """The unit that runs the server: the unit of its cgroup, when that unit's main process is the
    server itself or the `sh -c` that only waits for it (a scope has none: its processes are its
    own). '' otherwise: a server started from a shell in sshd's cgroup (a session without logind)
    or by cron is no unit's, whatever runs above it."""
    unit = cgroup_unit_name(cgroup_text)
    if not unit or unit.endswith(".scope"):
        return unit
    main = unit_main_pid(module, unit)
    return unit if main and main in (pid, _shell_parent(pid, table) or pid) else ""


def live_units(module: Any, units: list[str]) -> list[str]:
    """Those of `units` that run or start at boot: one `orchestrator stop` stopped and disabled
    is no server a take-over would replace."""
    systemctl = module.get_bin_path("systemctl")
    if not units or not systemctl:
        return list(units)
    rc, out, _err = module.run_command([systemctl, "show", *units, "--property=Id,UnitFileState,ActiveState"])
    if rc != 0:
        return list(units)
    live = set()
    for block in out.split("\n\n"):
        state = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if state.get("UnitFileState") == "enabled" or state.get("ActiveState") in ("active", "activating"):
            live.add(state.get("Id", ""))
    return [u for u in units if u in live]


def unit_main_pid(module: Any, unit: str) -> int:
    """systemd's MainPID of `unit`; 0 when it has none or systemctl cannot say."""
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return 0
    rc, out, _err = module.run_command([systemctl, "show", unit, "--property=MainPID", "--value"])
    return int(out.strip()) if rc == 0 and out.strip().isdigit() else 0


def cgroup_container(cgroup_text: str) -> tuple[str, str]:
    """(engine, container ID) when the cgroup is a docker or podman container's; ('', '')."""
    path = cgroup_path(cgroup_text)
    for engine, pattern in CONTAINER_CGROUP:
        match = pattern.search(path)
        if match:
            return engine, match.group(1)
    return "", ""


def _ignores_sighup(status: dict[str, str]) -> bool:
    """SigIgn's bit for SIGHUP (signal 1: the mask's lowest bit), as nohup leaves it."""
    try:
        return bool(int(status.get("SigIgn", "0"), 16) & 1)
    except ValueError:
        return False


def launcher(
    pid: int, table: dict[int, dict[str, Any]], status: dict[str, str], unit: str, container: dict, log: str
) -> dict[str, str]:
    """How the server was started, {kind, detail}: container (its cgroup), tmux or screen (an
    ancestor), unit (a systemd unit other than a login session), nohup (SIGHUP ignored), shell (its
    parent a shell), else init (detail: the parent, init or a subreaper once the shell that ran it
    exited)."""
    if container:
        return {"kind": "container", "detail": f"{container['engine']} container {container['name']}"}
    parent = table.get(pid, {}).get("ppid", 0)
    ancestor, seen = parent, set()
    while ancestor in table and ancestor not in seen:
        seen.add(ancestor)
        comm = table[ancestor]["comm"]
        if comm.startswith("tmux") or comm.lower() == "screen":
            kind = "tmux" if comm.startswith("tmux") else "screen"
            return {"kind": kind, "detail": f"{kind} server PID {ancestor}"}
        ancestor = table[ancestor]["ppid"]
    if unit:
        return {"kind": "unit", "detail": unit}
    comm = table.get(parent, {}).get("comm", "")
    if _ignores_sighup(status):  # its parent: init (the shell that ran it exited), or a shell
        return {"kind": "nohup", "detail": f"nohup, output to {log}" if log else "nohup"}
    if comm in SHELLS:
        return {"kind": "shell", "detail": f"{comm} PID {parent}"}
    return {"kind": "init", "detail": f"parent PID {parent} ({comm or 'gone'})"}


def inspect(exe: str, cid: str, timeout_s: float) -> tuple[dict, str]:
    """(`ENGINE inspect CID`'s first object, '') or ({}, why not)."""
    name = os.path.basename(exe)
    try:
        done = subprocess.run(
            [exe, "inspect", "--type", "container", cid], capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {}, f"{name} did not answer in {timeout_s:g} s"
    except OSError as exc:
        return {}, f"{name} could not run: {exc}"
    try:
        rows = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        rows = None
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        said = " ".join(done.stderr.decode("utf-8", "replace").split())[-200:]
        return {}, f"{name} inspect {cid[:12]} failed ({done.returncode}): {said}"
    return rows[0], ""


def container_command(row: dict) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """A container's command (Config.Entrypoint + Config.Cmd) and environment (Config.Env)."""
    config = row.get("Config") or {}
    entry, cmd = config.get("Entrypoint") or [], config.get("Cmd") or []
    words = [entry] if isinstance(entry, str) else list(entry)
    words += [cmd] if isinstance(cmd, str) else list(cmd)
    env = [str(e).encode("utf-8", "surrogateescape") for e in config.get("Env") or []]
    return [str(w).encode("utf-8", "surrogateescape") for w in words], parse_environ(b"\0".join(env))


# --- find ------------------------------------------------------------------------------------------


def executable(argv0: bytes, env: dict[bytes, bytes], cwd: bytes, exe: str) -> bytes:
    """argv[0] made absolute, as the shell that ran it found it: a path (against `cwd`), or the
    first match on the process's own PATH; else its /proc/PID/exe."""
    if b"/" in argv0:
        return os.path.normpath(os.path.join(cwd, argv0))
    for folder in env.get(b"PATH", b"").split(b":"):
        candidate = os.path.normpath(os.path.join(cwd, folder or b".", argv0))
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return os.fsencode(exe)


def listen_ports(table_text: str) -> dict[str, int]:
    """{socket inode: port} of each listening socket (state 0A) in a /proc/net/tcp or tcp6 text."""
    found = {}
    for row in table_text.splitlines()[1:]:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A":
            found[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    return found


def tree_ports(pid: int, pids: set[int]) -> list[int]:
    """TCP ports that `pids` listen on, seen from `pid`'s network namespace."""
    inodes: dict[str, int] = {}
    for table in ("tcp", "tcp6"):
        inodes.update(listen_ports((read_bytes(f"/proc/{pid}/net/{table}") or b"").decode()))
    ports = set()
    for each in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{each}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{each}/fd/{fd}")
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        ports.add(inodes[target[8:-1]])
    return sorted(ports)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def passwd_entry(uid: int) -> tuple[str, str]:
    """(home, login shell) of a user's passwd entry, which systemd's User= sets as $HOME and $SHELL;
    ("", "") for a user without one."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return "", ""
    return entry.pw_dir, entry.pw_shell


def systemd_path(module: Any) -> str:
    """The service manager's $PATH, which a unit gets (`systemctl show-environment`); "" unknown."""
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return ""
    rc, out, _err = module.run_command([systemctl, "show-environment"])
    if rc != 0:
        return ""
    for line in out.splitlines():
        if line.startswith("PATH="):
            return line[len("PATH=") :]
    return ""


def id_list(listed: str) -> set[int]:
    """The numbers of a kernel list such as "0-3,8,10-11" (Cpus_allowed_list, cpu/online)."""
    found: set[int] = set()
    for part in listed.split(","):
        low, _dash, high = part.strip().partition("-")
        with contextlib.suppress(ValueError):
            found.update(range(int(low), int(high or low) + 1))
    return found


def narrowed(allowed: str, online: str) -> str:
    """`allowed` (/proc/PID/status's Cpus_allowed_list or Mems_allowed_list) when it leaves out one
    of the `online` CPUs or nodes: taskset, numactl or a cpuset left only this trace. '' when it
    holds each of them, or either is unknown."""
    if not allowed or not online:
        return ""
    return allowed if id_list(online) - id_list(allowed) else ""


def _online(path: str, default: str) -> str:
    return (read_bytes(path) or default.encode()).decode("ascii", "replace").strip()


class Scan:
    """One look at the host's SGLang servers: a walk of /proc, the deployed units, and each
    container engine asked at most once per container."""

    def __init__(self, module: Any, paths: dict, engines: list[str], engine_timeout_s: float) -> None:
        self.module, self.engines, self.timeout = module, engines, engine_timeout_s
        self.table = walk()
        self.servers = servers_of(self.table)
        self.deployed = deployed_units(paths)
        self.btime = boot_time()
        self.problems: list[str] = []
        self.cpus = _online("/sys/devices/system/cpu/online", "")
        self.nodes = _online("/sys/devices/system/node/online", "0")  # a kernel without NUMA: one

    def container(self, pid: int, cgroup_text: str) -> tuple[dict[str, str], dict]:
        """({engine, id, name, image, unit}, its inspect row) of the container `pid` runs in;
        ({}, {}) for none. Without an answer from its engine, a problem: /proc speaks for it."""
        engine, cid = cgroup_container(cgroup_text)
        if not engine:
            return {}, {}
        said = {"engine": engine, "id": cid, "name": cid[:12], "image": ""}
        exe = self.module.get_bin_path(engine) if engine in self.engines else None
        if not exe:
            why = "is not installed here" if engine in self.engines else "is not among the engines asked"
            self.problems.append(
                f"PID {pid} runs in {engine} container {cid[:12]}: {engine} {why}: /proc is read"
            )
            return said, {}
        row, error = inspect(exe, cid, self.timeout)
        if error:
            self.problems.append(f"{error}: PID {pid} (container {cid[:12]}) is read from /proc")
            return said, {}
        config = row.get("Config") or {}
        said["name"] = str(row.get("Name") or said["name"]).lstrip("/")
        said["image"] = str(config.get("Image") or row.get("ImageName") or "")
        return said, row

    def owner(self, pid: int, cgroup_text: str) -> str:
        """The unit that runs the server (owning_unit)."""
        return owning_unit(self.module, pid, self.table, cgroup_text)

    def base(self, pid: int) -> dict[str, Any]:
        """What status and find both say of a server: {pid, ppid, uid, user, started, start_ticks,
        unit, ours, log, log_err, launcher, ports, container}, plus `_row` (its container's inspect)
        and `_status`. Raises Gone."""
        proc = self.table[pid]
        status = status_fields(pid)
        uid = int(status.get("Uid", "0").split()[0])
        cgroup_text = procs.proc_cgroup(pid)
        ours = procs.cgroup_unit(cgroup_text, self.deployed)
        container, row = self.container(pid, cgroup_text)
        label = ((row.get("Config") or {}).get("Labels") or {}).get("orchestrator.unit", "")
        unit = ours or (label if label in self.deployed else "") or self.owner(pid, cgroup_text)
        log = log_file(pid, 1)
        return {
            "pid": pid,
            "ppid": proc["ppid"],
            "uid": uid,
            "user": user_name(uid),
            "started": round(self.btime + proc["ticks"] / os.sysconf("SC_CLK_TCK"), 2),
            "start_ticks": proc["ticks"],
            "unit": unit,
            "ours": unit in self.deployed,
            "log": log,
            "log_err": log_file(pid, 2),
            "launcher": launcher(pid, self.table, status, unit, container, log),
            "ports": tree_ports(pid, tree(pid, self.table)),
            "container": container,
            "_row": row,
            "_status": status,
        }

    def full(self, pid: int) -> dict[str, Any]:
        """Everything find says of one server (its `_status` kept for the version's run). Raises
        Gone when the process exits (or its PID is reused) while it is read."""
        proc, said = self.table[pid], self.base(pid)
        raw_argv = proc["argv"]
        environ = read_bytes(f"/proc/{pid}/environ")
        if environ is None:
            if start_ticks(pid) != proc["ticks"]:
                raise Gone(pid)
            self.problems.append(f"PID {pid}: its environment cannot be read: run as root (-K)")
        pairs = parse_environ(environ or b"")
        cwd, exe = _readlink(pid, "cwd"), _readlink(pid, "exe")
        if said["_row"]:
            raw_argv, pairs = container_command(said["_row"])
        argv, flag_secrets, problems = read_argv(pid, raw_argv)
        env, env_secrets, more = read_env(pid, pairs)
        self.problems += problems + more
        if start_ticks(pid) != proc["ticks"]:
            raise Gone(pid)
        env_bytes = dict(pairs)
        python = executable(raw_argv[0], env_bytes, os.fsencode(cwd), exe) if raw_argv else b""
        if said["_row"]:  # the container's own file system: its argv[0] as written
            python = raw_argv[0] if raw_argv else b""
        home, shell = passwd_entry(said["uid"])
        said.update(
            home=home,
            shell=shell,
            argv=argv,
            env=env,
            secrets={**env_secrets, **flag_secrets},
            cwd=cwd,
            exe=exe,
            python=text(python)[0],
            entry=sglang_entry(raw_argv) or self.servers[pid],
            gpus=[],
            cpus_allowed=narrowed(said["_status"].get("Cpus_allowed_list", ""), self.cpus),
            mems_allowed=narrowed(said["_status"].get("Mems_allowed_list", ""), self.nodes),
        )
        return said


def program(proc: dict[str, Any]) -> str:
    """The name of what a process runs (its comm, else argv[0]'s last part), never its arguments:
    another program's argv may hold a secret (`--db-password hunter2`)."""
    name = proc["comm"] or text(_base(proc["argv"][0]) if proc["argv"] else b"")[0]
    return name[:64] or "?"


def _public(server: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in server.items() if not k.startswith("_")}


def _gone(pid: int) -> str:
    return f"PID {pid} exited while it was read"


def select(scan: Scan, pid: int, port: int) -> list[int]:
    """The servers asked for: `pid` alone, the one listening on `port`, or every one."""
    if pid:
        if pid not in scan.table:
            scan.problems.append(f"PID {pid} is not running")
            return []
        if pid not in scan.servers:
            under = server_of(pid, scan.table, scan.servers)
            if under:
                scan.problems.append(f"PID {pid} is a process of the SGLang server PID {under}, not a server")
            else:
                scan.problems.append(f"PID {pid} is not an SGLang server: {program(scan.table[pid])}")
            return []
        return [pid]
    if not port:
        return sorted(scan.servers)
    on_port = [s for s in sorted(scan.servers) if port in tree_ports(s, tree(s, scan.table))]
    if not on_port:
        scan.problems.append(f"port {port}: no SGLang server listens on it")
    elif len(on_port) > 1:
        who = ", ".join(f"PID {s}" for s in on_port)
        scan.problems.append(f"port {port}: {len(on_port)} SGLang servers listen on it: {who}")
        return []
    return on_port


def _with_gpus(module: Any, scan: Scan, servers: list[dict], nvidia_smi: str) -> None:
    """Each server's GPUs: where nvidia-smi lists it or a process below it."""
    _gpus, apps, error = query_nvidia_smi(module, nvidia_smi)
    if error:
        scan.problems.append(f"{error}: the servers' GPUs are not known")
        return
    for server in servers:
        pids = tree(server["pid"], scan.table)
        server["gpus"] = sorted({a["gpu"] for a in apps if a["pid"] in pids and a["gpu"] is not None})


def _as_server_user(server: dict[str, Any]) -> dict[str, Any]:
    """subprocess.run's user, group and extra_groups for a run as the server's own user and groups
    ({} where this module runs as that user already). Raises PermissionError where it cannot."""
    status, uid = server["_status"], server["uid"]
    if os.geteuid() == 0:
        return {
            "user": uid,
            "group": int(status.get("Gid", "0").split()[0]),
            "extra_groups": [int(g) for g in status.get("Groups", "").split()],
        }
    if uid == os.geteuid():
        return {}
    raise PermissionError(f"it runs as {server['user']}: only root may run its python as that user (-K)")


def _same_file(one: str, two: str) -> bool:
    try:
        a, b = os.stat(one), os.stat(two)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def read_version(server: dict[str, Any], module: Any, timeout_s: float) -> tuple[str, str]:
    """(SGLang's version as the server's python imports it, '') or ('', why not): on the host,
    that python (the very file the server runs) as the server's user, `-I`, in `/`, with PROBE_ENV;
    in a container, `ENGINE exec` of it there.

    Never the server's environment, directory or root: any user may start a process that looks
    like a server, with a PYTHONPATH whose sitecustomize would run as whoever reads the version."""
    container = server["container"]
    argv: list[str] = [server["python"], "-I", "-c", _VERSION_CODE]
    run: dict[str, Any] = {"env": PROBE_ENV, "cwd": "/"}
    if container:
        exe = module.get_bin_path(container["engine"])
        if not exe:
            return "", f"{container['engine']} is not installed here"
        argv = [exe, "exec", container["id"], *argv]
        run, timeout_s = {}, min(timeout_s, VERSION_TIMEOUT_S)
    else:
        timeout_s = VERSION_TIMEOUT_S
        if not _same_file(server["python"], f"/proc/{server['pid']}/exe"):
            return "", f"it is not the file PID {server['pid']} runs ({server['exe'] or 'unknown'})"
        try:
            run.update(_as_server_user(server))
        except PermissionError as exc:
            return "", str(exc)
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
            start_new_session=True,
            **run,
        )
    except subprocess.TimeoutExpired:
        return "", f"it did not answer in {timeout_s:g} s"
    except OSError as exc:
        return "", str(exc)
    if done.returncode != 0:
        tail = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        return "", tail
    return done.stdout.decode("utf-8", "replace").strip(), ""


def find(module: Any, p: dict) -> dict[str, Any]:
    """sglang_adopt's find: the servers asked for, as the host runs them. Reads only."""
    scan = Scan(module, p["paths"], p["engines"], p["engine_timeout_s"])
    servers = []
    for pid in select(scan, p["pid"], p["port"]):
        try:
            servers.append(scan.full(pid))
        except Gone:
            scan.problems.append(_gone(pid))
    if servers:
        _with_gpus(module, scan, servers, p["nvidia_smi"])
    version = ""
    if servers:
        version, why = read_version(servers[0], module, p["engine_timeout_s"])
        if why:
            scan.problems.append(f"SGLang's version could not be read with {servers[0]['python']}: {why}")
    return {
        "changed": False,
        "action": "find",
        "servers": [_public(s) for s in servers],
        "sglang_version": version,
        "systemd_path": systemd_path(module) if servers else "",
        "units": live_units(module, sorted(scan.deployed)),
        "problems": scan.problems,
    }


def foreign(module: Any, paths: dict) -> list[dict[str, Any]]:
    """The host's SGLang servers that no orchestrator unit runs, as status lists them: {pid, user,
    started, ports, launcher, argv (secrets redacted), log}. One walk of /proc; an engine is
    asked only about a server in a container (for its orchestrator.unit label)."""
    scan = Scan(module, paths, ["docker", "podman"], 10.0)
    found = []
    for pid in sorted(scan.servers):
        try:
            said = scan.base(pid)
        except Gone:
            continue
        if said["ours"]:
            continue
        argv, _secrets, _problems = read_argv(pid, scan.table[pid]["argv"])
        keep = ("pid", "user", "started", "ports", "launcher", "log")
        found.append({**{k: said[k] for k in keep}, "argv": argv})
    return found


# --- takeover -------------------------------------------------------------------------------------


def adopted_path(paths: dict, unit: str) -> str:
    """Where the takeover keeps a hand-started server's command, for the unit that took over."""
    stem = unit.rsplit(".", 1)[0] if "." in unit else unit
    return os.path.join(paths["state_dir"], "adopted", f"{stem}.json")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _shell_parent(pid: int, table: dict[int, dict[str, Any]]) -> int:
    """The server's parent when it is a non-interactive `sh -c` (bash, dash...) with no other
    child: it would go on to its next command (a loop would start the server again). 0 otherwise:
    an interactive shell (a tmux pane's, a login's) is never stopped."""
    parent = table.get(pid, {}).get("ppid", 0)
    proc = table.get(parent)
    if parent <= 1 or proc is None or proc["comm"] not in SHELLS or len(proc["argv"]) < 2:
        return 0
    option = proc["argv"][1]
    if not option.startswith(b"-") or option.startswith(b"--") or b"c" not in option or b"i" in option:
        return 0
    return parent if children(table).get(parent, []) == [pid] else 0


def _not_to_take(pid: int, table: dict[int, dict[str, Any]], cgroup_text: str, paths: dict) -> str:
    """Why `pid` is not for a takeover to stop ('' when it is): no SGLang server, a process of one
    of orchestrator's units (its own stop stops it), or one in a container (its engine would
    start it again, or keep the container)."""
    if not sglang_entry(table[pid]["argv"]):
        return f"PID {pid} is not an SGLang server: a takeover stops only the server adopt found"
    ours = procs.cgroup_unit(cgroup_text, deployed_units(paths))
    if ours:
        return f"PID {pid} runs in {ours}, an orchestrator unit: it is not started by hand"
    engine, cid = cgroup_container(cgroup_text)
    if engine:
        return (
            f"PID {pid} runs in {engine} container {cid[:12]}: stop it with `{engine} stop {cid[:12]}`; "
            "a takeover stops processes on the host, not containers"
        )
    return ""


def command_record(pid: int, table: dict[int, dict[str, Any]], unit: str) -> dict[str, Any]:
    """What relaunch needs to start the server's command again exactly: argv and environment as
    bytes (base64), working directory, user and groups, umask, ignored signals, log files. Raises
    Gone."""
    environ = read_bytes(f"/proc/{pid}/environ")
    status = status_fields(pid)
    cwd, exe = _readlink(pid, "cwd"), _readlink(pid, "exe")
    if environ is None or start_ticks(pid) != table[pid]["ticks"]:
        raise Gone(pid)
    raw = table[pid]["argv"]
    argv, _secrets, _problems = read_argv(pid, raw)
    return {
        "unit_name": unit,
        "pid": pid,
        "start_ticks": table[pid]["ticks"],
        "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": [_b64(w) for w in raw],
        "environ": _b64(environ),
        "cwd": _b64(os.fsencode(cwd)),
        "exe": exe,
        "uid": int(status.get("Uid", "0").split()[0]),
        "gid": int(status.get("Gid", "0").split()[0]),
        "user": user_name(int(status.get("Uid", "0").split()[0])),
        "groups": [int(g) for g in status.get("Groups", "").split()],
        "umask": int(status.get("Umask", "0022"), 8),
        "sig_ignored": status.get("SigIgn", "0"),
        "log": log_file(pid, 1),
        "log_err": log_file(pid, 2),
        "log_id": file_id(pid, 1),
        "log_err_id": file_id(pid, 2),
        "command": argv,  # for a person: the secrets redacted
    }


def stop_tree(pids: dict[int, int], root: int, gone_timeout_s: float) -> list[int]:
    """SIGTERM each of `pids` ({PID: start ticks}), wait up to gone_timeout_s for all to exit
    (and for what the root starts meanwhile), then SIGKILL; the PIDs still running after that."""

    def alive() -> list[int]:
        return [p for p, ticks in pids.items() if start_ticks(p) == ticks]

    def signal_all(sig: int) -> None:
        for p in alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + gone_timeout_s
    while alive() and time.monotonic() < deadline:
        if start_ticks(root) == pids[root]:  # what it started since is stopped with it
            now = walk()
            for p in tree(root, now) - set(pids):
                pids[p] = now[p]["ticks"]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGTERM)
        time.sleep(0.1)
    if alive():
        signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    return alive()


def takeover(module: Any, p: dict) -> dict[str, Any]:
    """sglang_restart's takeover step (and sglang_adopt's takeover): the hand-started server's
    command saved, then its process tree stopped. A PID gone, or now another process's, is
    nothing to stop: {taken: false, why}."""
    began, pid = time.monotonic(), p["pid"]
    result: dict[str, Any] = {
        "changed": False,
        "action": "takeover",
        "taken": False,
        "why": "",
        "pid": pid,
        "killed": [],
        "log": "",
        "record_path": "",
        "launcher": {},
        "took_s": 0.0,
    }
    table = walk()
    ticks = start_ticks(pid)
    if ticks is None or pid not in table:
        result["why"] = f"PID {pid} is gone: nothing to stop"
    elif ticks != p["start_ticks"]:
        result["why"] = (
            f"PID {pid} is another process now (started at tick {ticks}, not {p['start_ticks']}): "
            "nothing to stop"
        )
    if result["why"]:
        result["took_s"] = round(time.monotonic() - began, 3)
        return result
    cgroup_text = procs.proc_cgroup(pid)
    refused = _not_to_take(pid, table, cgroup_text, p["paths"])
    if refused:
        module.fail_json(msg=refused, **result)
    try:
        record = command_record(pid, table, p["unit_name"])
        status = status_fields(pid)
    except Gone:
        result["why"] = f"PID {pid} exited while it was read: nothing to stop"
        return result
    unit = owning_unit(module, pid, table, cgroup_text)
    shell = _shell_parent(pid, table)
    targets = [*([shell] if shell else []), *sorted(tree(pid, table))]
    path = adopted_path(p["paths"], p["unit_name"])
    result.update(
        changed=True,
        taken=True,
        killed=targets,
        log=record["log"],
        record_path=path,
        launcher=launcher(pid, table, status, unit, {}, record["log"]),
    )
    record["launcher"] = result["launcher"]
    if module.check_mode:
        result["took_s"] = round(time.monotonic() - began, 3)
        return result
    ensure_dir(module, p["paths"]["state_dir"])
    ensure_dir(module, os.path.dirname(path))
    write_atomic(path, (json.dumps(record, indent=4, sort_keys=True) + "\n").encode(), 0o600)
    left = stop_tree({t: table[t]["ticks"] for t in targets}, pid, p["gone_timeout_s"])
    result["took_s"] = round(time.monotonic() - began, 3)
    if left:
        module.fail_json(msg=f"PID {', '.join(map(str, left))} still running after SIGKILL", **result)
    return result


class TakeoverStep:
    """The takeover as sglang_restart runs each step: its options and its run()."""

    ARGUMENT_SPEC = TAKEOVER_SPEC

    @staticmethod
    def run(module: Any, p: dict) -> dict[str, Any]:
        return takeover(module, p)


# --- relaunch -------------------------------------------------------------------------------------


def file_id(pid: int, fd: int) -> list[int]:
    """[device, inode] of the regular file fd `fd` writes ([] otherwise): with the path, it names
    the very file."""
    try:
        info = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return []
    return [info.st_dev, info.st_ino] if stat.S_ISREG(info.st_mode) else []


def _open_saved_log(path: str, ident: list[int]) -> int:
    """The log opened while still root (-1: not opened). A root shell's redirect may have made it
    root's 0644 (`sudo -u svc nohup ... > /data/x.log`): the user could not open it again. Only
    the very file the server wrote at the takeover (its device and inode), never a link, a FIFO or
    a device: a user who swapped the path would make root write there."""
    if not path or len(ident) != 2:
        return -1
    with contextlib.suppress(OSError):
        seen = os.lstat(path)
        if not stat.S_ISREG(seen.st_mode) or [seen.st_dev, seen.st_ino] != ident:
            return -1
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK)
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and [info.st_dev, info.st_ino] == ident:
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
    return -1


def _exec_child(plan: dict[str, Any], report: int) -> None:
    """In the new process: its umask, ignored signals, stdin /dev/null and log files (opened while
    root: see _open_saved_log), then the server's user and groups, its directory, and the exec of
    its argv with its environment. A failure is written to `report` (closed by the exec when it
    succeeds)."""
    try:
        ignored = int(plan["sig_ignored"], 16)
        for sig in range(1, signal.NSIG):
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                continue
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_IGN if ignored & (1 << (sig - 1)) else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.umask(plan["umask"])
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        root = os.geteuid() == 0
        logs = ((1, plan["log"], plan["log_id"]), (2, plan["log_err"], plan["log_err_id"]))
        opened: dict[str, int] = {"": null}
        for _fd, path, ident in logs:
            held = _open_saved_log(path, ident) if root and path not in opened else -1
            if held >= 0:
                opened[path] = held
        if root:
            os.setgroups(plan["groups"])
            os.setgid(plan["gid"])
            os.setuid(plan["uid"])
        elif plan["uid"] != os.geteuid():
            raise PermissionError(f"only root may start a process as UID {plan['uid']}")
        for fd, path, _ident in logs:
            if path not in opened:  # as the server's user, as before: it may create the file
                opened[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(opened[path], fd)
        os.chdir(plan["cwd"])
        os.closerange(3, report)
        os.closerange(report + 1, 65536)
        os.execve(plan["path"], plan["argv"], plan["env"])
    except BaseException as exc:  # anything: said to the module, before the end below
        with contextlib.suppress(OSError):
            # One write under PIPE_BUF, a line of its own: never mixed into the PID's line.
            os.write(report, f"E:{type(exc).__name__}: {exc}"[:3000].replace("\n", " ").encode() + b"\n")
    finally:
        os._exit(127)


def spawn(plan: dict[str, Any]) -> tuple[int, str]:
    """(PID, '') of the command started in a session of its own, no child of this module (a
    double fork); (0, why) when it could not start."""
    read_end, write_end = os.pipe()  # not inherited by the exec: it closes at a successful one
    first = os.fork()
    if first == 0:
        try:
            os.close(read_end)
            os.setsid()
            second = os.fork()
            if second == 0:
                _exec_child(plan, write_end)
            os.write(write_end, f"P:{second}\n".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(first, 0)
    chunks = []
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    return spawn_report(b"".join(chunks))


def spawn_report(data: bytes) -> tuple[int, str]:
    """What spawn's pipe said: two writers (the child says the PID, the grandchild why its exec
    failed), each a line of its own, in either order."""
    lines = data.decode("utf-8", "replace").splitlines()
    error = next((line[2:] for line in lines if line.startswith("E:")), "")
    pid = next((line[2:] for line in lines if line.startswith("P:")), "")
    return (0, error or "the start failed") if error or not pid.isdigit() else (int(pid), "")


def relaunch_plan(record: dict[str, Any]) -> dict[str, Any]:
    """What _exec_child runs, from a takeover's record."""
    argv = [base64.b64decode(w) for w in record["argv"]]
    env = dict(parse_environ(base64.b64decode(record["environ"])))
    cwd = base64.b64decode(record["cwd"])
    return {
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "path": executable(argv[0], env, cwd, record.get("exe", "")),
        "uid": int(record["uid"]),
        "gid": int(record["gid"]),
        "groups": [int(g) for g in record.get("groups", [])],
        "umask": int(record.get("umask", 0o022)),
        "sig_ignored": str(record.get("sig_ignored", "0")),
        "log": str(record.get("log", "")),
        "log_err": str(record.get("log_err", "")),
        "log_id": [int(n) for n in record.get("log_id", [])],
        "log_err_id": [int(n) for n in record.get("log_err_id", [])],
    }


def wait_healthy(pid: int, ticks: int | None, url: str, timeout_s: float) -> str:
    """'' once `url` answers 200; else why not: the process exited, or the time ran out. Without
    a URL, the process running is enough."""
    deadline = time.monotonic() + timeout_s
    while True:
        if start_ticks(pid) != ticks or ticks is None:
            return "exited"
        if not url or health_status(url, timeout=2) == 200:
            return ""
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(0.25)


def relaunch(module: Any, p: dict) -> dict[str, Any]:
    """sglang_adopt's relaunch: the command a takeover saved for `unit_name`, started again as it
    ran, then /health waited for."""
    began = time.monotonic()
    if p["pid"] and start_ticks(p["pid"]) == p["start_ticks"]:  # never stopped: nothing to start
        return {
            "changed": False,
            "action": "relaunch",
            "pid": p["pid"],
            "start_ticks": p["start_ticks"],
            "healthy": True,
            "took_s": round(time.monotonic() - began, 3),
            "log": "",
            "argv": [],
        }
    path = adopted_path(p["paths"], p["unit_name"])
    record = read_json(path)
    if not record.get("argv"):
        module.fail_json(msg=f"no hand-started command was saved for {p['unit_name']} ({path} is missing)")
    if p["pid"] and (record.get("pid"), record.get("start_ticks")) != (p["pid"], p["start_ticks"]):
        module.fail_json(
            msg=f"the command saved for {p['unit_name']} is of PID {record.get('pid')}, not of PID "
            f"{p['pid']} the deploy took over: it is not started"
        )
    plan = relaunch_plan(record)
    argv, _secrets, _problems = read_argv(0, plan["argv"])
    result: dict[str, Any] = {
        "changed": True,
        "action": "relaunch",
        "pid": 0,
        "start_ticks": 0,
        "healthy": False,
        "took_s": 0.0,
        "log": plan["log"],
        "argv": argv,
    }
    if module.check_mode:
        return result
    pid, error = spawn(plan)
    if error:
        module.fail_json(msg=f"the hand-started command could not start again: {error}", **result)
    result["pid"] = pid
    ticks = start_ticks(pid)
    result["start_ticks"] = ticks or 0
    why = wait_healthy(pid, ticks, p["health_url"], p["health_timeout_s"])
    result["healthy"] = not why
    result["took_s"] = round(time.monotonic() - began, 3)
    if why == "exited":
        where = f": see {plan['log']}" if plan["log"] else ""
        module.fail_json(msg=f"the hand-started command, started again as PID {pid}, exited{where}", **result)
    if why:
        module.fail_json(
            msg=f"the hand-started command, started again as PID {pid}, did not answer 200 on "
            f"{p['health_url']} in {p['health_timeout_s']:g} s",
            **result,
        )
    return result
