"""What `docker run` and `podman run` refuse or read otherwise, checked on the control machine.

A profile with `runtime.kind: docker` or `podman` starts SGLang inside a container. The unit's
ExecStart= is then the engine's `run` command (launch.py). A value the engine refuses is only found
out on the host, after the running server was stopped. So each value the profile puts into that
command is checked here: the image reference, /dev/shm's size, mount paths, and the further run
options a site may add.

Each rule is a pure function of plain values. It returns its problem, worded with the fix, or None
when the value is fine. The rules hold for both engines as Debian bookworm ships them (docker.io
20.10, podman 4.3.1). tests/unit/test_container_cli.py hands every rendered command to the real
CLIs.

Every regular expression here is ASCII (re.ASCII, explicit classes), because Go's regexp is. Both
engines parse with it. Python's `\\w` and `\\d` take any Unicode letter or digit. Every match is a
fullmatch, because Python's `$` also matches before a trailing newline.

A path is judged as the engines read it: by its text (Go's path.Clean, `clean_path`). A path with
`..` is refused. The engines resolve it by its text, but the host's file system resolves it through
its symbolic links.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable

from orchestrator.profile import systemd_rules

# --- the image -----------------------------------------------------------------------------

# The grammar of github.com/distribution/reference (regexp.go), which both engines parse with,
# as podman 4.3.1's copy of it (containers/image docker/reference) has it: no IPv6 registry.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # reference's [\w][\w.-]{0,127}, with Go's ASCII \w
_DIGEST = r"sha256:[0-9a-f]{64}"
_REFERENCE = re.compile(
    rf"(?P<domain>{_DOMAIN})/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?",
    re.ASCII,
)
#: distribution/reference's NameTotalLengthMax.
NAME_MAX = 255
EXAMPLE_IMAGE = "docker.io/lmsysorg/sglang:v0.5.9"


def _shown(value: str, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _has_domain(ref: str) -> bool:
    """As the engines split a reference (docker's splitDockerDomain): the first component is a
    registry when it holds '.' or ':', or is localhost."""
    first, slash, _ = ref.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def image_problem(ref: str) -> str | None:
    """runtime.image: a full reference, registry included, naming a tag or a digest.

    A short name (`lmsysorg/sglang`) is docker.io's to Docker but depends on
    registries.conf's search list to Podman, which refuses to guess inside a unit (short-name
    mode `enforcing` cannot ask); an implicit `:latest` is whatever was pushed last.
    """
    if len(ref) > 2 * NAME_MAX:  # before any regular expression: a name, a tag and a digest fit
        return f"is {len(ref)} characters long: no image reference is (the name alone may have {NAME_MAX})"
    if not _has_domain(ref):
        return (
            f"{_shown(ref)} has no registry: write the full reference, e.g. {EXAMPLE_IMAGE} (podman does not "
            "resolve short names in a unit)"
        )
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        if ref.startswith("["):
            return f"{_shown(ref)}: podman 4.3 takes no IPv6 registry address: name the registry by host name"
        if "@" in ref and not re.search(rf"@{_DIGEST}\Z", ref, re.ASCII):
            return f"{_shown(ref)}: the digest must be sha256: and 64 lowercase hex digits"
        return (
            f"{_shown(ref)} is not an image reference: REGISTRY/PATH[:TAG][@sha256:DIGEST], with a lowercase "
            f"path, e.g. {EXAMPLE_IMAGE}"
        )
    name_length = len(match.group("domain")) + 1 + len(match.group("path"))
    if name_length > NAME_MAX:
        return f"the image name is {name_length} characters long; the engines refuse over {NAME_MAX}"
    if match.group("tag") is None and match.group("digest") is None:
        return (
            f"{_shown(ref)} names neither a tag nor a digest, so it is whatever :latest was when a host "
            "pulled it; pin it: IMAGE:TAG@sha256:DIGEST"
        )
    return None


def image_note(ref: str) -> str | None:
    """A warning, not an error: a tag without a digest can be moved to other bytes, so two hosts
    (or one host before and after a pull) may run different images under one profile."""
    match = _REFERENCE.fullmatch(ref)
    if match is None or match.group("digest") is not None or match.group("tag") is None:
        return None
    return (
        f"runtime.image {ref} is pinned by tag only: a tag can be moved, so hosts may run different "
        "images; add the digest (IMAGE:TAG@sha256:...) to pin it"
    )


# --- sizes, names, paths -----------------------------------------------------------------

#: The largest number the engines' parsers take (Go's int64: strconv.ParseInt(s, 10, 64) for a
#: --ulimit, go-units' RAMInBytes for a size).
INT64_MAX = 2**63 - 1

#: --shm-size as both engines take it (go-units RAMInBytes; podman's man page names b, k, m, g).
SHM_SIZE = r"[1-9][0-9]{0,12}[bkmg]?"


def shm_size_problem(value: str) -> str | None:
    if not re.fullmatch(SHM_SIZE, value, re.ASCII):
        return f"{_shown(value)} is not a size: write a number with k, m or g (binary units), e.g. 32g"
    if size_bytes(value) > INT64_MAX:  # go-units' RAMInBytes would wrap it to a negative size
        return (
            f"{value} is {size_bytes(value)} bytes, above the engines' largest size ({INT64_MAX}): give less"
        )
    return None


def size_bytes(value: str) -> int:
    """A SHM_SIZE value in bytes, as go-units' RAMInBytes reads it (k, m, g: 1024-based)."""
    units = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
    if value[-1] in units:
        return int(value[:-1]) * units[value[-1]]
    return int(value)


#: A container name as both engines take it (docker's validContainerNamePattern).
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", re.ASCII)


def container_name_problem(name: str) -> str | None:
    """The container is named after the unit's stem (`sglang` for sglang.service)."""
    if _CONTAINER_NAME.fullmatch(name):
        return None
    return (
        f"the container is named after the unit, and {_shown(name)} is not a container name: use 2 or more "
        "letters, digits, '_', '.' or '-' (no '@' or ':'), starting with a letter or digit"
    )


def clean_path(path: str) -> str:
    """An absolute path as Go's path.Clean (filepath.Clean) writes it, which both engines apply to
    mount targets and sources and docker to device paths: `.` and repeated or trailing '/' go,
    `..` removes the name before it by its text. (Python's normpath keeps a leading '//'.)"""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def _dotdot_problem(path: str) -> str | None:
    if ".." not in path.split("/"):
        return None
    return (
        f"{_shown(path)} has '..', which the engines resolve by its text (to {clean_path(path)}) and the "
        "host through its symbolic links: write the path it means"
    )


def mount_path_problem(path: str) -> str | None:
    """A `--volume SOURCE:TARGET:ro` path: ':' splits the value and ',' the --mount form, a newline
    ends the word; `/` itself (however written: `/.`, `//`) cannot be a mount target in either
    engine, and two targets that clean to one path are one mount point (podman: "duplicate mount
    destination")."""
    bad = sorted(set(path) & set(":,\n"))
    if bad:
        return (
            f"{_shown(path)} has {', '.join(map(repr, bad))}, which the engines' --volume syntax cannot hold"
        )
    dotdot = _dotdot_problem(path)
    if dotdot:
        return dotdot
    if clean_path(path) == "/":
        return "'/' cannot be mounted (or mounted over) in a container; name a directory"
    return None


def mount_source_problem(path: str) -> str | None:
    """A host path a container gets mounted: a mount path, and not one that holds GPU devices (a
    bind mount of /dev hands the container every GPU's device node, outside server.gpus; with
    podman's --cgroups=disabled no device cgroup stops it using them)."""
    problem = mount_path_problem(path)
    if problem:
        return problem
    gpu = gpu_device_path(clean_path(path))
    if gpu:
        return (
            f"{_shown(path)}: {gpu}: mount no device paths; GPUs reach the container from server.gpus "
            "and other devices from runtime.options --device"
        )
    return None


def ulimit_value(limit: str) -> str:
    """A systemd limit (service.limits, as systemd_rules reads it: `infinity`, a count in base 0,
    or a size with K to E, 1024-based) as the engines' --ulimit takes it: -1 for unlimited,
    otherwise the plain number systemd would set."""
    if limit == "infinity":
        return "-1"
    size = systemd_rules.size_bytes(limit)
    if size is None:
        size = systemd_rules.c_integer(limit, unsigned=True)
    return limit if size is None else str(size)


def ulimit_problem(limit: str) -> str | None:
    """A service.limits value a container's --ulimit cannot carry: above Go's int64, which both
    engines parse a limit into (systemd takes up to 2^64-1 on the host)."""
    value = ulimit_value(limit)
    if value != "-1" and (not value.isdigit() or int(value) > INT64_MAX):
        return (
            f"{limit} is {value} as the engines' --ulimit, above the largest they take ({INT64_MAX}); "
            "give a smaller limit, or infinity"
        )
    return None


# --- devices ---------------------------------------------------------------------------------

#: Character devices that are, or lead to, NVIDIA GPUs under /dev (first component), and why. A
#: container gets GPUs from server.gpus only (docker's --gpus, podman's CDI devices).
_GPU_PATHS = {
    "nvidia": "an NVIDIA device (a GPU /dev/nvidiaN, or nvidiactl, nvidia-uvm, nvidia-caps)",
    "char": "/dev/char's links name every device by number (195:N is /dev/nvidiaN)",
    "dri": "/dev/dri holds the GPUs' DRM nodes (nvidia-drm makes one per GPU, with by-path links)",
}
_ALL_DEV = "all of /dev, every GPU included"


def gpu_device_path(path: str) -> str | None:
    """Why a clean path names (or holds) an NVIDIA GPU device, or None. Links elsewhere in /dev
    that lead to one are only seen on the host: preflight resolves each --device there
    (orchestrator_host/preflight.py device_problems)."""
    parts = path.split("/")
    if parts[:2] != ["", "dev"]:
        return None
    if len(parts) == 2:
        return _ALL_DEV
    for prefix, why in _GPU_PATHS.items():
        if parts[2] == prefix or (prefix == "nvidia" and parts[2].startswith(prefix)):
            return why
    return None


#: Device cgroup permissions (containers/common parse.Device, docker's validDeviceMode): r, w and
#: m, each at most once.
_DEVICE_MODE = re.compile(r"(?!.*(.).*\1)[rwm]{1,3}", re.ASCII)


def device_problem(value: str) -> str | None:
    """A --device HOST[:CONTAINER][:MODE] value (already of OPTIONS' characters) as both engines
    split it: a second part that is a mode is the mode, else the path in the container. Neither
    path may be an NVIDIA device once cleaned, and each must be written clean: docker's client
    cleans some forms, podman none."""
    parts = value.split(":")
    has_mode = len(parts) == 3 or (len(parts) == 2 and not parts[1].startswith("/"))
    mode, paths = (parts[-1], parts[:-1]) if has_mode else (None, parts)
    if mode is not None and not _DEVICE_MODE.fullmatch(mode):
        return f"--device {_shown(value)}: mode {mode!r} is not r, w and m, each at most once (e.g. rw)"
    for where, path in zip(("", " in the container"), paths, strict=False):
        clean = clean_path(path)
        gpu = gpu_device_path(clean)
        if gpu:
            shown = _shown(path) if clean == path else f"{_shown(path)} ({clean})"
            return f"GPUs reach the container from server.gpus, not --device: {shown}{where}: {gpu}"
        dotdot = _dotdot_problem(path)
        if dotdot:
            return f"--device {dotdot}"
        if clean != path:  # podman opens it as written: `/dev/null/` is "not a directory"
            return f"--device {_shown(path)}{where} is {clean} to docker, as written to podman: write {clean}"
    return None


# --- further run options (runtime.options) ---------------------------------------------------

#: Linux capabilities (capabilities(7)), as a regular expression.
_CAPABILITY = (
    "AUDIT_CONTROL|AUDIT_READ|AUDIT_WRITE|BLOCK_SUSPEND|BPF|CHECKPOINT_RESTORE|CHOWN|DAC_OVERRIDE|"
    "DAC_READ_SEARCH|FOWNER|FSETID|IPC_LOCK|IPC_OWNER|KILL|LEASE|LINUX_IMMUTABLE|MAC_ADMIN|"
    "MAC_OVERRIDE|MKNOD|NET_ADMIN|NET_BIND_SERVICE|NET_BROADCAST|NET_RAW|PERFMON|SETFCAP|SETGID|"
    "SETPCAP|SETUID|SYSLOG|SYS_ADMIN|SYS_BOOT|SYS_CHROOT|SYS_MODULE|SYS_NICE|SYS_PACCT|SYS_PTRACE|"
    "SYS_RAWIO|SYS_RESOURCE|SYS_TIME|SYS_TTY_CONFIG|WAKE_ALARM"
)
#: --ulimit names both engines know (go-units ulimit.go), less the two service.limits sets.
_ULIMIT = "core|cpu|data|fsize|locks|msgqueue|nice|nproc|rss|rtprio|rttime|sigpending|stack"
#: A path under /dev as written: empty and `.` components are cleaned away (device_problem).
_DEV_PATH = r"/dev(?:/[A-Za-z0-9_.+-]*)+"

#: Options a site may add, each with the values both engines take and how to say them. Anything
#: that changes how the server is reached, which GPUs it sees or what it reads (network, GPUs,
#: mounts, environment, privileges) is the profile's own field, or not offered.
OPTIONS: dict[str, tuple[str | None, str]] = {
    "--cap-add": (
        rf"(?:CAP_)?(?:{_CAPABILITY})",
        "a Linux capability in capitals, such as IPC_LOCK or SYS_NICE",
    ),
    "--security-opt": (
        r"apparmor=[A-Za-z0-9_.-]+|label=(?:disable|(?:user|role|type|level):[A-Za-z0-9_.:-]+)"
        r"|no-new-privileges(?::(?:true|false))?|seccomp=(?:unconfined|/[A-Za-z0-9_./-]+)",
        "apparmor=PROFILE, label=disable, label=type:TYPE (user, role, level), no-new-privileges, "
        "seccomp=unconfined or seccomp=/PATH.json",
    ),
    "--pids-limit": (r"-1|[1-9][0-9]{0,9}", "-1 (no limit) or a positive count"),  # bound: PID_MAX_LIMIT
    "--ulimit": (
        rf"(?:{_ULIMIT})=(?:-1|[0-9]{{1,19}})(?::(?:-1|[0-9]{{1,19}}))?",
        f"NAME=SOFT[:HARD] with NAME one of {_ULIMIT.replace('|', ', ')} and -1 for unlimited",
    ),
    "--device": (
        rf"{_DEV_PATH}(?::{_DEV_PATH})?(?::[rwm]{{1,3}})?",
        "a host device under /dev[:CONTAINER_PATH][:rwm], e.g. /dev/infiniband",
    ),
    "--init": (None, "no value"),
}
#: Options the profile sets through its own fields: runtime.options may not say them again.
OWNED_OPTIONS = {
    "--gpus": "server.gpus",
    "--network": "the unit (always host: the server binds server.host:server.port)",
    "--net": "the unit (always host: the server binds server.host:server.port)",
    "--ipc": "runtime.ipc_host",
    "--shm-size": "runtime.shm_size",
    "--volume": "runtime.mounts",
    "-v": "runtime.mounts",
    "--mount": "runtime.mounts",
    "--env": "env: (or nccl:, secret_env:)",
    "-e": "env: (or nccl:, secret_env:)",
    "--env-file": "secret_env:",
    "--name": "service.unit_name",
    "--pull": "runtime.pull",
    "--rm": "the unit",
    "--label": "the unit",
    "--entrypoint": "server.python (the command is SGLang's argv)",
}
#: The kernel's PID_MAX_LIMIT (64-bit): pids.max refuses more ("Invalid argument" when the container
#: starts), and podman parses --pids-limit into an int32 ("value out of range" past 2^31-1).
PID_MAX_LIMIT = 4 * 1024 * 1024
#: --ulimit names that service.limits already sets for the container.
OWNED_ULIMITS = {"memlock": "service.limits.memlock", "nofile": "service.limits.nofile"}


def run_option(option: str) -> tuple[str, str | None]:
    """One runtime.options entry, `--name=value`, `--name value` or a bare `--flag`, as
    (name, value); raises ValueError worded with the fix."""
    match = re.match(r"([^= ]*)([= ]?)(.*)", option, re.S | re.ASCII)
    assert match is not None  # every part may be empty: it matches any text
    name, sep, value = match.groups()
    if name in OWNED_OPTIONS:
        raise ValueError(f"{name} is set by {OWNED_OPTIONS[name]}, not runtime.options")
    if name not in OPTIONS:
        raise ValueError(
            f"{option[:40]!r} is not an option runtime.options allows; allowed: {', '.join(OPTIONS)}"
        )
    pattern, wanted = OPTIONS[name]
    if pattern is None:
        if sep:
            raise ValueError(f"{name} takes no value")
        return name, None
    if not sep or not value:
        raise ValueError(f"{name} needs a value: {wanted}")
    limit = value.partition("=")[0]
    if name == "--ulimit" and limit in OWNED_ULIMITS:
        raise ValueError(f"--ulimit {limit} is set by {OWNED_ULIMITS[limit]}, not runtime.options")
    if not re.fullmatch(pattern, value, re.ASCII):
        raise ValueError(f"{name} {value[:40]!r} is not {wanted}")
    check = _VALUE_CHECKS.get(name)
    problem = check(value) if check else None
    if problem:
        raise ValueError(problem)
    return name, value


def _pids_limit_problem(value: str) -> str | None:
    if int(value) <= PID_MAX_LIMIT:
        return None
    return f"--pids-limit {value} is above the kernel's largest pids.max, {PID_MAX_LIMIT}: give less, or -1"


def _ulimit_option_problem(value: str) -> str | None:
    """NAME=SOFT[:HARD] as go-units' ParseUlimit takes it: int64 numbers, soft within hard."""
    numbers = value.partition("=")[2].split(":")
    if any(int(n) > INT64_MAX for n in numbers):
        return (
            f"--ulimit {value}: a limit is above the largest the engines take ({INT64_MAX}); -1 is unlimited"
        )
    if not _soft_within_hard(value):
        return f"--ulimit {value}: the soft limit is above the hard one"
    return None


def _soft_within_hard(value: str) -> bool:
    soft, _, hard = value.partition("=")[2].partition(":")
    if not hard or hard == "-1":
        return True
    return soft != "-1" and int(soft) <= int(hard)


#: What the engines take of a value beyond OPTIONS' pattern, for the options that say more.
_VALUE_CHECKS: dict[str, Callable[[str], str | None]] = {
    "--device": device_problem,
    "--ulimit": _ulimit_option_problem,
    "--pids-limit": _pids_limit_problem,
}
