"""What systemd 252 refuses or silently changes in a unit's values, checked on the control machine.

A unit that systemd refuses is only found out on the host, after the running server was
stopped; a value that systemd changes starts a server other than the profile says. Each rule
is a pure function of one profile value and returns its problems (none when systemd reads the
value back unchanged), worded with the fix. Each cites the systemd 252 code it follows;
tests/unit/test_systemd_oracle.py loads rendered units with the real systemd to prove both
directions: a value these rules pass reads back exactly, and a value they refuse is one
systemd refuses or changes.

Only values that cannot be quoted need rules: `plan` quotes ExecStart= words and
Environment= assignments, which keeps spaces, quotes, `%`, `$` and control characters intact.
"""

from __future__ import annotations

import re

#: Bytes of one path component and of a whole path with its NUL (path_is_valid() ->
#: path_find_first_component(): NAME_MAX, PATH_MAX).
NAME_MAX = 255
PATH_MAX = 4096

#: env_name_is_valid(): VALID_BASH_ENV_NAME_CHARS, ASCII only.
_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

#: string_is_safe(), which config_parse_exec() applies to the executable: control
#: characters, QUOTES, backslash and DEL.
_EXEC_UNSAFE = frozenset("\"'\\\x7f" + "".join(map(chr, range(1, 0x20))))

#: conf-parser.c strips WHITESPACE from both ends of every value.
_WHITESPACE = " \t\n\r"


def _shown(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def path_length_problems(path: str) -> list[str]:
    """path_is_valid(): a component over NAME_MAX bytes or a path of PATH_MAX bytes is refused."""
    problems = []
    if len(path.encode()) >= PATH_MAX:
        problems.append(
            f"is {len(path.encode())} bytes long: systemd refuses paths of {PATH_MAX} bytes or more"
        )
    long = [part for part in path.split("/") if len(part.encode()) > NAME_MAX]
    if long:
        problems.append(
            f"has a component of {len(long[0].encode())} bytes ({_shown(long[0], 30)}): "
            f"systemd refuses path components over {NAME_MAX} bytes; shorten it"
        )
    return problems


def executable_problems(path: str) -> list[str]:
    """The executable of ExecStart= (server.python), as config_parse_exec() reads it.

    - string_is_safe(): quotes, backslashes, DEL and control characters are refused with
      "Executable name contains special characters", whatever the quoting;
    - a trailing '/' is refused with "Executable path specifies a directory";
    - `$`: the unit's first word is both the path systemd executes and argv[0]; at start
      replace_env_argv() turns `$$` into `$` in argv[0] only, so no spelling gives both the
      same `$`-holding path;
    - path_is_valid() lengths ("Neither a valid executable name nor an absolute path").
    """
    problems = []
    unsafe = sorted(set(path) & _EXEC_UNSAFE)
    if unsafe:
        problems.append(
            f"{_shown(path)} has {', '.join(map(repr, unsafe))}: systemd refuses an executable name with "
            "quotes, backslashes or control characters; use a path without them (a symlink will do)"
        )
    if "$" in path:
        problems.append(
            f"{_shown(path)} has '$': systemd would execute it with '$' but give it as argv[0] after "
            "$-expansion; use a path without '$' (a symlink will do)"
        )
    if path.endswith("/"):
        problems.append(
            f"{_shown(path)} ends in '/': systemd refuses a directory; name the executable itself"
        )
    return problems + path_length_problems(path)


def simplified(path: str) -> str:
    """path_simplify(): what systemd keeps of an absolute path: no '//', '.' components or trailing '/'."""
    return "/" + "/".join(part for part in path.split("/") if part not in ("", "."))


def working_directory_problems(path: str) -> list[str]:
    """WorkingDirectory=, which systemd takes unquoted and unescaped (config_parse_working_directory()).

    - conf-parser.c: an odd number of trailing backslashes joins the next line into the value
      (the next setting vanishes into the path, and `systemd-analyze verify` accepts it);
      surrounding whitespace is stripped;
    - path_simplify_and_warn(): a '..' component is refused ("path is not normalized");
      '//', '.' components and a trailing '/' are simplified away; path_is_valid() lengths.
    """
    problems = []
    stripped = path.strip(_WHITESPACE)
    if path != stripped:
        problems.append(f"{_shown(path)} has surrounding whitespace, which systemd strips; remove it")
    if (len(path) - len(path.rstrip("\\"))) % 2:
        problems.append(
            f"{_shown(path)} ends in a backslash, which joins the next unit line into the path in systemd; "
            "remove it"
        )
    if ".." in stripped.split("/"):
        problems.append(
            f"{_shown(path)} has a '..' component: systemd refuses it as not normalized; "
            "write the directory it means"
        )
    elif simplified(stripped) != stripped:
        problems.append(f"systemd would use {_shown(simplified(stripped))} for {_shown(path)}; write that")
    return problems + path_length_problems(path)


def env_name_problem(name: str) -> str | None:
    """Environment= names (config_parse_environ() -> env_assignment_is_valid() -> env_name_is_valid()).

    Only ASCII letters, digits and '_', not starting with a digit: systemd drops any other
    assignment with "Invalid environment assignment, ignoring", and the unit still starts.
    """
    if name and not name[0].isdigit() and set(name) <= _ENV_NAME_CHARS:
        return None
    return (
        "not a valid environment variable name for systemd (ASCII letters, digits and '_', not starting "
        "with a digit): it would drop the variable with only a warning; rename it"
    )


#: Variables systemd sets for the service itself that the unit relies on, and why: a profile's
#: Environment= or EnvironmentFile= assignment would override them (exec_child() merges the
#: manager's own variables first and the unit's after, the later winning).
#:
#: The others systemd sets (systemd.exec(5), "Environment Variables Set or Propagated by the
#: Service Manager") may be set: $HOME, $USER, $LOGNAME and $SHELL are service.user's defaults,
#: which a site may move ($HOME for caches); the unit never reads $INVOCATION_ID, $JOURNAL_STREAM
#: or $MAINPID (status and logs take the journal's own _SYSTEMD_INVOCATION_ID field); and
#: $NOTIFY_SOCKET and $WATCHDOG_* matter only to podman's --sdnotify=conmon, whose environment is
#: out of a profile's reach (a container unit has no Environment= lines: the variables go to the
#: container). LD_PRELOAD and the like stay allowed as well: the profile already chooses the
#: executable, and preloading an allocator (jemalloc) is an ordinary setting.
SERVICE_MANAGER_ENV = {
    "CREDENTIALS_DIRECTORY": "systemd sets it to the unit's credentials directory, where ExecStart's "
    "--config word finds the API key; set there, it would send --config to another file",
}


def service_manager_env_problem(name: str) -> str | None:
    """An environment variable name systemd sets for the service and the unit relies on."""
    why = SERVICE_MANAGER_ENV.get(name)
    return f"{name} cannot be set here: {why}; remove it" if why else None


# --- unit names --------------------------------------------------------------------------------------

#: unit_name_is_valid() (unit-name.c): a name shorter than UNIT_NAME_MAX, of VALID_CHARS before the
#: suffix ('@' aside, which only templates and instances have).
UNIT_NAME_MAX = 256
_UNIT_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:-_.\\")


def unit_name_problems(name: str, suffix: str = ".service") -> list[str]:
    """The name of a unit file orchestrator writes, as systemd 252 reads it: unit_name_is_valid()
    with UNIT_NAME_PLAIN, and a name systemd finds again.

    - shorter than UNIT_NAME_MAX, ending in the suffix after a non-empty name, of ASCII letters,
      digits and ':-_.\\' only;
    - no '@': `x@.service` is a template, which systemd never starts itself ("Unit name x@.service
      is missing the instance name", while `systemd-analyze verify` accepts the file) and
      `@.service` is refused outright. An instance (`x@a.service`) could be loaded from its own
      file, but it also takes every drop-in of its template (`x@.service.d/`, which any package may
      ship) and no container can be named after it: refused too, one rule for every runtime.
    """
    stem = name.removesuffix(suffix)
    if stem == name or not stem:
        kind = suffix.lstrip(".")
        return [f"{_shown(name)} is not a {kind} unit name: write NAME{suffix}, e.g. sglang{suffix}"]
    problems = []
    if len(name.encode()) >= UNIT_NAME_MAX:
        problems.append(
            f"is {len(name.encode())} bytes long: systemd refuses unit names of {UNIT_NAME_MAX} bytes or more"
        )
    if stem.startswith("@"):
        problems.append(f"{_shown(name)} starts with '@': systemd refuses it; use a name without '@'")
    elif "@" in stem:
        what = "a template" if stem.endswith("@") else "an instance of a template"
        problems.append(
            f"{_shown(name)} names {what} ('@'), not a unit systemd starts from its own file; "
            "use a name without '@'"
        )
    bad = sorted(set(stem) - _UNIT_NAME_CHARS - {"@"})
    if bad:
        problems.append(
            f"{_shown(name)} has {', '.join(map(repr, bad[:5]))}: systemd takes only ASCII letters, digits "
            "and ':-_.\\' in a unit name"
        )
    return problems


# --- [Service] options the profile may set (service.limits, service.extra) ------------------------

#: A resource limit as systemd's config_parse_limit() reads it: a number, a size with a binary
#: suffix (K, M, G, T: 1024-based for the byte limits) or `infinity`.
_LIMIT_RE = re.compile(r"^(infinity|[0-9]+[KMGT]?)$")

#: Directives a site may add under service.extra, each with the values systemd 252 takes
#: (systemd.exec(5), systemd.resource-control(5)); anything else is refused here rather than
#: by systemd-analyze on the host after the server was stopped.
_CPU_LIST = r"[0-9]+(-[0-9]+)?([ ,][0-9]+(-[0-9]+)?)*"
EXTRA_DIRECTIVES: dict[str, tuple[str, str]] = {
    "CPUAffinity": (_CPU_LIST, "CPU indexes and ranges, e.g. '0-31,64-95'"),
    "NUMAPolicy": (
        "default|preferred|bind|interleave|local",
        "default, preferred, bind, interleave or local",
    ),
    "NUMAMask": (_CPU_LIST + "|all", "NUMA node indexes and ranges, e.g. '0-1', or 'all'"),
    "Nice": ("-?[0-9]+", "an integer from -20 to 19"),
    "OOMScoreAdjust": ("-?[0-9]+", "an integer from -1000 to 1000"),
    "IOSchedulingClass": ("realtime|best-effort|idle|none", "realtime, best-effort, idle or none"),
    "IOSchedulingPriority": ("[0-7]", "an integer from 0 to 7"),
    "CPUSchedulingPolicy": ("other|batch|idle|fifo|rr", "other, batch, idle, fifo or rr"),
    "CPUWeight": ("idle|[0-9]+", "1 to 10000, or idle"),
    "MemoryMax": ("infinity|[0-9]+[KMGT]?|[0-9]+%", "a size such as 512G, a percentage, or infinity"),
    "MemoryHigh": ("infinity|[0-9]+[KMGT]?|[0-9]+%", "a size such as 512G, a percentage, or infinity"),
    "TasksMax": ("infinity|[0-9]+|[0-9]+%", "a count, a percentage, or infinity"),
    "LimitCORE": ("infinity|[0-9]+[KMGT]?", "a size such as 0 or 4G, or infinity"),
    "LimitSTACK": ("infinity|[0-9]+[KMGT]?", "a size such as 8M, or infinity"),
    "UMask": ("0?[0-7]{3}", "an octal mask such as 0027"),
    "TimeoutAbortSec": ("infinity|[0-9]+", "seconds, or infinity"),
}
_RANGES = {"Nice": (-20, 19), "OOMScoreAdjust": (-1000, 1000), "CPUWeight": (1, 10000)}
#: Directives the profile sets through its own fields: service.extra may not say them again.
OWNED_DIRECTIVES = {
    "Type": "the unit type is fixed",
    "User": "service.user",
    "WorkingDirectory": "service.working_directory",
    "Environment": "env: (or nccl:)",
    "EnvironmentFile": "service.environment_files",
    "ExecStart": "server:",
    "Restart": "service.restart",
    "RestartSec": "service.restart_sec",
    "LimitMEMLOCK": "service.limits.memlock",
    "LimitNOFILE": "service.limits.nofile",
    "TimeoutStartSec": "service.start_timeout_s",
    "TimeoutStopSec": "service.stop_timeout_s",
    "LoadCredential": "api_key",
}


def limit_problem(value: str) -> str | None:
    """A LimitMEMLOCK=/LimitNOFILE= value systemd reads as a limit (config_parse_limit)."""
    if _LIMIT_RE.fullmatch(value):
        return None
    return f"{_shown(value)} is not a limit: use infinity, a number, or a size such as 64G"


def extra_problem(name: str, value: str) -> str | None:
    """One service.extra directive: on the allow-list, its value in the form systemd takes, and
    one line (a newline would start a second directive)."""
    if name in OWNED_DIRECTIVES:
        return f"{name} is set by {OWNED_DIRECTIVES[name]}, not service.extra"
    if name not in EXTRA_DIRECTIVES:
        return (
            f"{name} is not a directive service.extra allows; allowed: {', '.join(sorted(EXTRA_DIRECTIVES))}"
        )
    if any(ch in value for ch in "\n\r\0") or "=" in value:
        return (
            f"{_shown(value)}: one value on one line, without '=' (a newline would start a second directive)"
        )
    pattern, wanted = EXTRA_DIRECTIVES[name]
    if not re.fullmatch(pattern, value):
        return f"{_shown(value)} is not {wanted}"
    low, high = _RANGES.get(name, (None, None))
    if low is not None and value.lstrip("-").isdigit() and not low <= int(value) <= high:
        return f"{value} is not {wanted}"
    return None
