"""The read-only checks before a restart (preflight_checks): that the unit is ours to replace,
SGLang's version and flags on the host's Python or in the container image (the engine's own
`create` judging the unit's run command), the unit as systemd reads it, the model and
drafter, the GPU set and its holders, the port, disk for logs and the service user. Every
problem is found before anything stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from . import memfit, modelfiles

# gpus' own _gpus_are and _mib: gpu_set_problems words GPU sets and sizes as gpus does
from .containers import CONTAINER_LABEL, container_units, descendants, proc_parents
from .files import read_bytes, read_json, write_atomic
from .gpus import (
    _gpus_are,
    _mib,
    describe,
    foreign_gpus,
    gpu_ranges,
    missing_gpus,
    owned_apps,
    query_nvidia_smi,
)
from .procs import argv0, cgroup_unit, proc_cgroup, start_ticks
from .systemd import parse_systemctl_show, try_systemctl_show, verify_unit
from .units import OWNER_PROPS, deployed_units, foreign_write, installed_units, unit_digest, unit_path

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.gpus
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.memfit
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.modelfiles
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401

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


#: How a problem names each port preflight checks, by the profile's setting that moves it.
PORT_NAMES = {"server.port": "port", "disaggregation.bootstrap_port": "bootstrap port"}


def port_problems(
    port: int,
    unit_name: str,
    owners: list[tuple[int, str, str]],
    units: dict[str, dict],
    installed: Collection[str],
    field: str = "server.port",
    fix: str = "",
) -> list[str]:
    """Why `port` is not free for `unit_name`, one line each. First another installed
    orchestrator unit of this host whose facts say this port, running or enabled (started, it
    would take it): `installed` holds those; then who else listens on it now: `owners` are (PID, argv[0], the
    orchestrator unit it runs in or '') of the listening processes. Our own server may hold it.
    `units`: deployed_units, for the profiles. `field`: the profile's setting that moves the port
    (PORT_NAMES); `fix` ends the line of a listener outside orchestrator's units."""
    label = PORT_NAMES[field]
    clash = sorted(u for u in installed if u != unit_name and units.get(u, {}).get("port") == port)
    problems = [
        f"{label} {port} is the port of {_named(u, units)} on this host: give this profile another {field}"
        for u in clash
    ]
    neighbours: dict[str, list[str]] = {}
    foreign: list[str] = []
    for pid, name, unit in owners:
        if unit != unit_name and unit not in clash:  # a clash is named once, above
            (neighbours.setdefault(unit, []) if unit else foreign).append(f"PID {pid} {name}")
    problems += [
        f"{label} {port} is taken by {', '.join(who)} of {_named(unit, units)}, another orchestrator unit "
        f"on this host: give this profile another {field}"
        for unit, who in sorted(neighbours.items())
    ]
    if foreign:
        problems.append(f"{label} {port} is taken by {', '.join(foreign)} (not {unit_name}){fix}")
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
    if any(not unit for *_holder, unit in owners):
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


def cache_problem(cache_dir: str, min_free_mib: int) -> str:
    """The compile cache directory cannot hold the caches: a file in its place, on a read-only file
    system, or too little space where it is (or will be: systemd makes it at start)."""
    if not cache_dir:
        return ""
    path = cache_dir
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"compile cache dir {cache_dir}: {path} is not a directory"
    try:
        stat = os.statvfs(path)
    except OSError as exc:
        return f"compile cache dir {cache_dir}: {exc.strerror}"
    if stat.f_flag & os.ST_RDONLY:
        return f"compile cache dir {cache_dir}: {path} is on a read-only file system"
    free_mib = stat.f_bavail * stat.f_frsize // 2**20
    if free_mib < min_free_mib:
        return (
            f"compile cache dir {cache_dir} has {free_mib} MiB free, the JIT and compile caches need "
            f"{min_free_mib} MiB (free space, or set service.compile_cache: false)"
        )
    return ""


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
    rc, out, _err = module.run_command([exe, "image", "inspect", ref])
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
    if c["engine"] == "docker":
        gpu_problems, gpu_notes = docker_gpu_problems(module, exe, c["run_words"])
        problems += gpu_problems
        notes = [*notes, *gpu_notes]
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
        flag, _eq, value = word.partition("=")
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
        number, _sep, driver = line.strip().partition(" ")
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
    found: list[str] = []
    seen = 0
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


# --- how docker hands over the GPUs ---------------------------------------------------------

#: What docker's daemon looks for on its PATH, once at its start, to offer --gpus (moby
#: daemon/nvidia_linux.go, docker 19.03 to 28): NVIDIA's prestart hook. Without it the daemon has no
#: GPU driver, and `docker run --gpus` fails only at start: `could not select device driver "" with
#: capabilities: [[gpu]]` (`create` takes it). The newest releases also take NVIDIA's CDI hook
#: (nvidia-cdi-hook) in its place, turning --gpus into CDI devices; a host with only that one is
#: refused here all the same, with runtime.gpu_devices: cdi as the way that works from docker 25 on.
NVIDIA_HOOK = "nvidia-container-runtime-hook"
#: The toolkit's own configuration: in its `cdi` or `csv` mode the hook refuses to be called
#: directly, which is what --gpus does ("invoking the NVIDIA Container Runtime Hook directly (e.g.
#: specifying the docker --gpus flag) is not supported").
NVIDIA_TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
_HOOK_REFUSING_MODE = re.compile(r'^\s*mode\s*=\s*["\']?(cdi|csv)["\']?\s*(?:#.*)?$', re.MULTILINE)
#: An unread spec that may be NVIDIA's (YAML without PyYAML here): it may define the devices.
_NVIDIA_KIND = re.compile(r'(?:^|[\s{,])["\']?kind["\']?\s*:\s*["\']?nvidia\.com/gpu', re.MULTILINE)
#: Where CDI specs are files (the CDI library reads these two suffixes only).
CDI_SUFFIXES = (".json", ".yaml")


def engine_options(run_words: list[str]) -> list[str]:
    """The run command's words before the image (the engine's options, not SGLang's argv)."""
    return run_words[: next((i for i, w in enumerate(run_words) if not w.startswith("-")), len(run_words))]


def cdi_requests(run_words: list[str]) -> list[str]:
    """The CDI devices (KIND=NAME) the run command's --device words ask for."""
    return [
        w.partition("=")[2]
        for w in engine_options(run_words)
        if w.startswith("--device=") and not w.partition("=")[2].startswith("/") and "=" in w[9:]
    ]


def hook_mode(config: str) -> str:
    """The NVIDIA toolkit mode in which its hook refuses --gpus (`cdi`, `csv`), '' otherwise."""
    found = _HOOK_REFUSING_MODE.search(config)
    return found.group(1) if found else ""


def cdi_spec_devices(text: str, loader: Any = None) -> tuple[str, list[str]] | None:
    """(kind, device names) of one CDI spec's text, JSON (which is YAML too, comment lines and all)
    or, with `loader` (yaml.safe_load where PyYAML is here), YAML; None when it cannot be read."""
    try:
        spec = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    except ValueError:
        if loader is None:
            return None
        try:
            spec = loader(text)
        except Exception:  # any parse error: this file is not read, and preflight says so
            return None
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return None
    names = [str(d.get("name")) for d in spec["devices"] if isinstance(d, dict) and "name" in d]
    return str(spec.get("kind", "")), names


def _yaml_loader() -> Any:
    """yaml.safe_load where PyYAML is on the host (Ansible does not need it there), else None."""
    try:
        import yaml
    except ImportError:
        return None
    return yaml.safe_load


def cdi_devices(dirs: list[str]) -> tuple[set[str], list[str]]:
    """({KIND=NAME} of every device the CDI specs in `dirs` define, the spec files not read)."""
    loader, found, unread = _yaml_loader(), set[str](), list[str]()
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if not name.endswith(CDI_SUFFIXES):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                unread.append(path)  # it may be NVIDIA's: nothing here can tell
                continue
            try:
                read = cdi_spec_devices(data.decode("utf-8"), loader)
            except UnicodeDecodeError:
                read = None
            if read is None:
                if _NVIDIA_KIND.search(data.decode("utf-8", errors="replace")):
                    unread.append(path)
                continue
            found.update(f"{read[0]}={device}" for device in read[1])
    return found, unread


def _gpus_flag_problem(module: Any) -> str:
    """Why docker's --gpus cannot work on this host, or ''."""
    if not module.get_bin_path(NVIDIA_HOOK):
        return (
            f"docker's --gpus needs the NVIDIA Container Toolkit on this host ({NVIDIA_HOOK} is not on "
            "PATH, so the daemon has no GPU driver): install it and restart docker (the daemon looks "
            "for it at its start), or set runtime.gpu_devices: cdi with a CDI spec (nvidia-ctk cdi generate)"
        )
    try:
        with open(NVIDIA_TOOLKIT_CONFIG, encoding="utf-8", errors="replace") as fh:
            mode = hook_mode(fh.read())
    except OSError:
        return ""
    if not mode:
        return ""
    return (
        f"docker's --gpus calls {NVIDIA_HOOK}, which refuses that in the toolkit's mode = \"{mode}\" "
        f"({NVIDIA_TOOLKIT_CONFIG}): set runtime.gpu_devices: cdi, or the toolkit's mode to auto or legacy"
    )


def docker_gpu_problems(module: Any, exe: str, run_words: list[str]) -> tuple[list[str], list[str]]:
    """(problems, notes) of docker's way to the GPUs, which its `create` does not judge (both fail
    only at start, after the stop): --gpus needs NVIDIA_HOOK; CDI devices need the daemon's CDI on
    (its spec directories in `docker info`) and each device in a spec there (else: `CDI device
    injection failed: unresolvable CDI devices ...`)."""
    problems: list[str] = []
    if any(w.startswith("--gpus=") for w in engine_options(run_words)):
        problem = _gpus_flag_problem(module)
        if problem:
            problems.append(problem)
    wanted = cdi_requests(run_words)
    if not wanted:
        return problems, []
    rc, out, _err = module.run_command([exe, "info", "--format", "{{json .CDISpecDirs}}"])
    try:
        dirs = json.loads(out) if rc == 0 else None
    except ValueError:
        dirs = None
    if not isinstance(dirs, list) or not dirs:
        problems.append(
            "docker on this host has no CDI (runtime.gpu_devices: cdi; `docker info` lists no CDI spec "
            'directories): docker 25 or later with "features": {"cdi": true} in /etc/docker/daemon.json, '
            "or set runtime.gpu_devices: gpus"
        )
        return problems, []
    defined, unread = cdi_devices([str(d) for d in dirs])
    missing = [w for w in wanted if w not in defined]
    if missing and not unread:
        problems.append(
            f"CDI device{'s' * (len(missing) > 1)} {', '.join(missing)} not defined by any spec in "
            f"{', '.join(map(str, dirs))}: generate it (nvidia-ctk cdi generate "
            "--output=/etc/cdi/nvidia.yaml) or fix server.gpus"
        )
    notes = [
        f"CDI spec {path} could not be read here (a YAML spec needs PyYAML on this host): "
        "its devices are not checked"
        for path in unread
    ]
    return problems, notes if missing else []


def mount_problems(sources: list[str]) -> list[str]:
    """runtime.mounts whose host path is missing: podman refuses to start the container, and
    docker makes an empty directory in its place (a model cache that is silently empty)."""
    return [
        f"runtime.mounts source {src} does not exist on this host: create it or fix the path "
        "(podman would not start; docker would mount an empty directory made in its place)"
        for src in sources
        if not os.path.exists(src)
    ]


#: Where each model directory is named in a profile.
FIELDS = {"model": "server.model_path", "draft": "speculative.draft_model_path"}


def _model_problems(c: dict) -> tuple[list[str], dict[str, dict]]:
    """The model's and drafter's config problems, and each readable directory's config."""
    target, error = read_config(c["model_path"])
    problems = [f"model path: {error}"] if error else []
    configs = {"model": target} if not error else {}
    if c["draft_model_path"]:
        draft, error = read_config(c["draft_model_path"])
        if error:
            problems.append(f"draft model path: {error}")
        else:
            configs["draft"] = draft
            if c["algorithm"]:
                problems += drafter_problems(c["algorithm"], target, draft, c["draft_model_path"])
    return problems, configs


def _scans(c: dict, configs: dict[str, dict], state_dir: str) -> tuple[list[str], list[str], dict[str, dict]]:
    """Each readable model directory's files and weights (modelfiles.scan, its cache in the state
    directory: a 61-shard header takes seconds to parse). Notes, not problems: a directory without
    safetensors files (SGLang loads other formats; only the fit needs headers) and a scan that ran
    out of time (slow storage: the fit and the comparison across hosts are skipped). A problem: files
    that cannot load (a corrupt header, a missing shard)."""
    problems, notes, scans = [], [], {}
    for role, config in configs.items():
        path = c["model_path"] if role == "model" else c["draft_model_path"]
        scan = modelfiles.scan(path, cache_dir=os.path.join(state_dir, "model-scans"))
        if scan.get("note") and c["memory"]:
            notes.append(f"{FIELDS[role]}: {scan['note']} The GPU memory fit is skipped.")
        if scan.get("timed_out"):
            notes.append(
                f"{FIELDS[role]}: {scan['error']}; the GPU memory fit and the comparison across hosts skip it"
            )
        elif scan["error"]:
            problems.append(f"{FIELDS[role]}: {scan['error']}")
        scans[role] = {**scan, "config": config}
    return problems, notes, scans


def _memory_fit(c: dict, scans: dict[str, dict], gpus: list[dict]) -> tuple[list[str], list[str], dict]:
    """The GPU memory fit of the planned start (memfit.predict) on the smallest GPU of its set,
    when every model's weights could be sized: (problems, notes, prediction). A quantization flag
    changes the weights' size in memory: the headers cannot tell it, so the fit is skipped."""
    wanted = [g for g in gpus if g["index"] in c["gpus"] and g.get("memory_total_mib")]
    sized = all(not s["error"] and s.get("shards") for s in scans.values())
    if not c["memory"] or not wanted or not sized or "model" not in scans:
        return [], [], {}
    quantization = c["memory"].get("quantization")
    if quantization:
        note = f"memory: --quantization {quantization} changes the weights' size: the fit is skipped"
        return [], [note], {}
    total = min(int(g["memory_total_mib"]) for g in wanted)
    draft = scans.get("draft")
    settings = {**c["memory"], "gpus_available": len(gpus)}
    calibration = c["calibration"] or None
    if calibration and calibration.get("model_digest") != modelfiles.files_digest(scans):
        calibration = None  # measured on other files
    fit = memfit.predict(scans["model"], draft, settings, total, calibration)
    fit["gpu"] = {"name": wanted[0].get("name", ""), "total_mib": total}
    fit["settings"] = settings
    fit["last_measured"] = calibration or {}
    problems = [f"memory: {p}" for p in fit.get("problems", [])]
    if problems and fit.get("fixes"):
        problems.append("memory: what would fit: " + "; ".join(fit["fixes"]))
    return problems, [f"memory: {n}" for n in fit.get("notes", [])], fit


def _files_out(scans: dict[str, dict], file_lists: bool) -> dict[str, dict]:
    """What goes back of each scan: its fingerprint, and its files when asked for."""
    keep = ("path", "error", "digest", "shards", "tensor_bytes", "config_sha256", "elapsed_s")
    out = {}
    for role, scan in scans.items():
        out[role] = {k: scan.get(k) for k in keep}
        if file_lists:
            out[role]["files"] = scan.get("files", [])
            out[role]["weights"] = scan.get("weights", [])
    return out


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


def _gpu_problems(
    module: Any, unit_name: str, units: dict[str, dict], c: dict, taken: set[int]
) -> tuple[list[str], list[dict], list[int]]:
    """(problems, nvidia-smi's GPUs, those of our set that `taken` holds: the hand-started server
    the restart stops first, no problem)."""
    gpus, apps, error = query_nvidia_smi(module, c["nvidia_smi"])
    if error:
        return [error], [], []
    apps = owned_apps(module, apps, {*units, unit_name})
    held = sorted({a["gpu"] for a in apps if a["pid"] in taken and a["gpu"] in c["gpus"]})
    apps = [a for a in apps if a["pid"] not in taken]
    return gpu_set_problems(gpus, apps, c["gpus"], unit_name, units, c["allow_gpu_holders"]), gpus, held


def takeover_tree(pid: int, ticks: int) -> set[int]:
    """The hand-started server a deploy takes over (PreflightChecks.takeover_pid) and every process
    below it; empty when there is none, it no longer runs, or the PID is another process's now
    (it started at another time than `ticks`; 0: not known, the PID alone says): then every
    check runs as usual."""
    if pid <= 0 or not os.path.isdir(f"/proc/{pid}"):
        return set()
    if ticks and start_ticks(pid) != ticks:
        return set()
    return descendants(pid, proc_parents())


def takeover_note(pid: int, ports: list[int], gpus: list[int]) -> str:
    """What the hand-started server holds that is no problem: the restart stops it first."""
    held = [f"port {ports[0]}" if len(ports) == 1 else f"ports {', '.join(map(str, ports))}"] if ports else []
    if gpus:
        held.append(f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpu_ranges(gpus)}")
    who = f"PID {pid}, the hand-started server this deploy takes over"
    if not held:
        return f"{who}, is stopped first"
    verb = "are" if len(held) > 1 or len(gpus) > 1 or len(ports) > 1 else "is"
    return f"{' and '.join(held)} {verb} held by {who}: it is stopped first"


def _unit_problems(module: Any, unit_name: str, paths: dict, c: dict) -> tuple[list[str], str]:
    """systemd-analyze's verdict on the planned unit before anything stops, not after; skipped
    when that very unit is installed (it runs). (problems, digest verified)."""
    if not c["unit_content"]:
        return [], ""
    data = c["unit_content"].encode()
    installed = read_bytes(unit_path(paths, unit_name))
    if installed is not None and installed == data:
        return [], ""
    _verified, complaint = verify_unit(module, unit_name, data)
    if complaint:
        return [f"systemd-analyze verify refuses the planned {unit_name}: {complaint}"], ""
    return [], unit_digest(data)


# --- a prefill/decode disaggregation role -------------------------------------------------------

#: What SGLang imports for each --disaggregation-transfer-backend (disaggregation/<backend>/conn.py
#: and the engine it loads, 0.5.9 to 0.5.23), and what provides it. mooncake_tcp is mooncake with
#: MC_FORCE_TCP set: the same engine. fake moves nothing and imports nothing.
TRANSFER_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    "mooncake": (("mooncake.engine",), "Mooncake (mooncake-transfer-engine)"),
    "mooncake_tcp": (("mooncake.engine",), "Mooncake (mooncake-transfer-engine)"),
    "nixl": (("nixl._api",), "NIXL"),
    "mori": (("mori.cpp", "mori.io"), "MORI"),
    "ascend": (("memfabric_hybrid",), "memfabric_hybrid"),
    "fake": ((), ""),
}

#: The backends that hand disaggregation.ib_device to their RDMA library (mooncake's own check of
#: the names runs at start, after the stop). SGLang drops it for mooncake_tcp; fake and ascend never
#: read it.
IB_BACKENDS = ("mooncake", "nixl", "mori")

#: Where the kernel lists the host's RDMA devices, the directory SGLang's own check reads.
IB_SYSFS = "/sys/class/infiniband"

#: The end of a problem naming a listener on the bootstrap port outside orchestrator's units.
_BOOTSTRAP_FIX = ": stop it or give this profile another disaggregation.bootstrap_port"


def transfer_problem(module: Any, python: str, backend: str) -> str:
    """Why the server's `python` cannot import the transfer backend's engine, or ''. SGLang imports
    it only when the KV cache exists: the server would stop, load the weights, then die."""
    modules, package = TRANSFER_MODULES.get(backend, ((), ""))
    if not modules:
        return ""
    code = f"import {', '.join(modules)}"
    rc, out, err = module.run_command([python, "-c", code])
    if rc == 0:
        return ""
    return (
        f"transfer backend {backend}: `{code}` fails in {python} ({_tail(out, err)}): install {package} "
        "for that Python or choose another disaggregation.transfer_backend"
    )


def ib_device_problem(devices: list[str], backend: str) -> str:
    """The named IB devices this host lacks (in IB_SYSFS), or '' (none named, or not read by
    `backend`)."""
    if not devices or backend not in IB_BACKENDS:
        return ""
    try:
        have = sorted(os.listdir(IB_SYSFS))
    except OSError:
        have = []
    missing = [d for d in devices if d not in have]
    if not missing:
        return ""
    lack = f"IB device {missing[0]} is" if len(missing) == 1 else f"IB devices {', '.join(missing)} are"
    return (
        f"disaggregation.ib_device: {lack} not on this host ({IB_SYSFS} has {', '.join(have) or 'none'}): "
        "name devices this host has, or leave ib_device out for the backend to find them"
    )


def pd_problems(
    module: Any, unit_name: str, paths: dict, c: dict, units: dict[str, dict], taken: set[int]
) -> tuple[list[str], list[str], int]:
    """(problems, notes, the bootstrap port when the hand-started server holds it, else 0) of the
    unit's PD role (checks.pd; no transfer_backend: none): the bootstrap port free but for our own
    unit, the backend's engine importable by the host's python (a container's is not run for it:
    a note), and the IB devices present."""
    pd = c["pd"] or {}
    backend = pd.get("transfer_backend") or ""
    if not backend:
        return [], [], 0
    problems: list[str] = []
    notes: list[str] = []
    port, held = pd.get("bootstrap_port") or 0, 0
    if port:  # a decode server opens none
        owners = port_owners(module, port, {*units, unit_name})
        held = port if any(pid in taken for pid, *_rest in owners) else 0
        owners = [owner for owner in owners if owner[0] not in taken]
        same_port = [u for u in installed_units(paths) if units[u].get("port") == port]
        installed = live_units(module, same_port)
        field = "disaggregation.bootstrap_port"
        problems += port_problems(port, unit_name, owners, units, installed, field, _BOOTSTRAP_FIX)
    modules, package = TRANSFER_MODULES.get(backend, ((), ""))
    if c["engine"] and modules:
        notes.append(
            f"transfer backend {backend}: `import {', '.join(modules)}` is not tried in image {c['image']}: "
            f"without {package} there the server fails after loading the weights"
        )
    elif not c["engine"] and os.access(c["python"], os.X_OK):  # a missing python is named once, above
        problems.append(transfer_problem(module, c["python"], backend))
    problems.append(ib_device_problem(pd.get("ib_devices") or [], backend))
    return [p for p in problems if p], notes, held


def preflight_checks(module: Any, unit_name: str, paths: dict, checks: dict) -> dict:
    """Everything that can be known before a stop, read-only: that the unit is ours to replace
    (foreign_write: not ssh.service, nor a masked one), SGLang's version and flags (the
    host's Python's, or in a container runtime the engine, the image and the image's own SGLang),
    the unit as systemd reads it, the model and drafter (a container gets them mounted read-only
    at the same paths, so the host's files are the container's), our GPU set and its holders
    (another orchestrator unit of this host named as such, a container's processes by its
    label), the port (another unit's included), disk for logs. Every problem at once, one line
    each: {problems, notes, sglang_version, gpus, help_checked, verified_digest}; notes say what
    could not be checked yet (an image to be pulled) without failing. A hand-started server the
    deploy takes over (takeover_pid) may hold the ports and the GPUs: a note names it. A prefill
    or decode server's role (pd): its bootstrap port, transfer backend and IB devices."""
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
    config_problems, configs = _model_problems(checks)
    problems += config_problems
    scan_problems, scan_notes, scans = _scans(checks, configs, paths["state_dir"])
    problems += scan_problems
    notes += scan_notes
    problems += mount_problems(checks["mounts"])
    units = deployed_units(paths)
    taken = takeover_tree(checks["takeover_pid"], checks["takeover_start_ticks"])
    gpu_problems, gpus, taken_gpus = _gpu_problems(module, unit_name, units, checks, taken)
    problems += gpu_problems
    fit_problems, fit_notes, memory = _memory_fit(checks, scans, gpus)
    problems += fit_problems
    notes += fit_notes
    owners = port_owners(module, checks["port"], {*units, unit_name})
    taken_port = checks["port"] if any(pid in taken for pid, *_rest in owners) else 0
    owners = [owner for owner in owners if owner[0] not in taken]
    same_port = [u for u in installed_units(paths) if units[u].get("port") == checks["port"]]
    problems += port_problems(checks["port"], unit_name, owners, units, live_units(module, same_port))
    role_problems, role_notes, taken_bootstrap = pd_problems(module, unit_name, paths, checks, units, taken)
    problems += role_problems
    notes += role_notes
    if taken:
        held = [port for port in (taken_port, taken_bootstrap) if port]
        notes.append(takeover_note(checks["takeover_pid"], held, taken_gpus))
    disk = disk_problem(checks["log_dir"], checks["min_free_mib"])
    if disk:
        problems.append(disk)
    cache = cache_problem(checks["cache_dir"], checks["cache_min_free_mib"])
    if cache:
        problems.append(cache)
    user = user_problem(checks["user"])
    if user:
        problems.append(user)
    return {
        "problems": problems,
        "notes": notes,
        "sglang_version": version,
        "gpus": len(gpus),
        "help_checked": help_checked,
        "verified_digest": verified,
        "memory": memory,
        "model_files": _files_out(scans, checks["file_lists"]),
    }
