"""What systemd 252 refuses or silently changes in a unit's values, checked on the control machine.

A unit that systemd refuses is only found out on the host, after the running server was stopped. A
value that systemd changes or ignores with only a warning starts a server other than the profile
says. That is why the rules run here.

Each rule is a pure function of a profile value. Some take a few service.extra directives together.
Some take the plan's words and unit text, for the sizes that cannot reach the process. Each returns
its problems, worded with the fix. It returns none when systemd reads the value back unchanged. Each
cites the systemd 252 (or kernel) code it follows.

tests/unit/test_systemd_oracle.py loads rendered units with the real systemd to prove both
directions. A value these rules pass reads back exactly. A value they refuse is one systemd refuses
or changes. Where systemd-analyze is installed, systemd_check.py also asks it about the whole unit.

Only values that cannot be quoted need rules. render/launch.py quotes ExecStart= words and
Environment= assignments, which keeps spaces, quotes, `%`, `$` and control characters intact.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import ROUND_DOWN, Decimal

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


#: Unit name characters that systemd reads otherwise in a setting built from the name: the unit's
#: CacheDirectory=orchestrator/<stem> (config_parse_exec_directories()) C-unescapes '\\' (`\x2d` is
#: '-') and splits at ':' (DIRECTORY:SYMLINK), while the cache variables name the text as written.
_SETTING_UNSAFE = {
    "\\": ("a backslash", "an escape (\\x2d is '-')"),
    ":": ("':'", "the start of a link's name"),
}


def unit_setting_problem(name: str) -> str | None:
    """A unit name of orchestrator's that its settings cannot name as written (CacheDirectory=).
    Only ASCII letters, digits, '-', '_' and '.' are left (unit_name_problems() refuses the rest)."""
    bad = [_SETTING_UNSAFE[ch] for ch in _SETTING_UNSAFE if ch in name]
    if not bad:
        return None
    return (
        f"{_shown(name)} has {' and '.join(what for what, _ in bad)}, which systemd reads in the unit's "
        f"CacheDirectory= as {' and '.join(why for _, why in bad)}: its directory would not be the one the "
        "cache variables name; use only ASCII letters, digits, '-', '_' and '.'"
    )


# --- text systemd takes ---------------------------------------------------------------------------


def noncharacter(text: str) -> str | None:
    """The first Unicode noncharacter in `text` (U+FDD0 to U+FDEF, U+FFFE and U+FFFF of every
    plane), or None. systemd's unichar_is_valid() refuses them: a unit line holding one is "not
    UTF-8 clean", and systemd drops it (ExecStart= too, so the unit fails to load)."""
    for ch in text:
        code = ord(ch)
        if 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE:
            return ch
    return None


# --- numbers as systemd 252 reads them --------------------------------------------------------

UINT64_MAX = 2**64 - 1
#: parse_time() refuses a count of seconds this large or larger (`(usec_t) l >= USEC_INFINITY /
#: multiplier`: ERANGE, "Failed to parse ... ignoring").
SECONDS_LIMIT = UINT64_MAX // 10**6
#: cpu_set_add(): a CPU (or NUMA node) index from 8192 on fails the line ("Cannot add CPU").
CPU_INDEX_LIMIT = 8192
#: What parse_size(..., 1024) multiplies a suffix by (it also takes "B", fractions and sums such
#: as "1G512M", which service.extra does not).
SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50, "E": 2**60}

_SIZE = re.compile(r"([0-9]+)([KMGTPE]?)")
#: parse_permyriad(): a whole percentage or one with one or two decimals (safe_atoi() reads the
#: whole part, so a leading zero is octal there too).
_PERCENT = re.compile(r"([0-9]+)(?:\.([0-9]{1,2}))?%")


def c_integer(text: str, *, unsigned: bool = False) -> int | None:
    """The integer systemd's safe_atoi() (`unsigned`: safe_atou(), safe_atou64()) reads in `text`,
    or None where it refuses it.

    Both parse in base 0 after mangle_base(): `0x` is hex, `0b` binary, `0o` and a bare leading
    `0` octal, so `010` is 8 and `019` is refused ("Invalid argument"); strtol() skips leading
    whitespace and takes one sign, and the unsigned ones refuse a '-' on anything but 0.
    """
    s = text.lstrip(_WHITESPACE)
    base = 0
    if s[:2] in ("0b", "0B", "0o", "0O"):
        base, s = (2 if s[1] in "bB" else 8), s[2:]
    s = s.lstrip(" \t\n\v\f\r")
    sign = s[:1] if s[:1] in ("+", "-") else ""
    body = s[len(sign) :]
    if base == 0:
        if re.match(r"0[xX][0-9a-fA-F]", body):
            base, body = 16, body[2:]
        else:
            base = 8 if body.startswith("0") else 10
    if not body or not set(body.lower()) <= set("0123456789abcdef"[:base]):
        return None
    value = -int(body, base) if sign == "-" else int(body, base)
    return None if unsigned and value < 0 else value


def _integer_problem(value: str, low: int, high: int, wanted: str, *, unsigned: bool = False) -> str | None:
    """An integer systemd reads with safe_atoi()/safe_atou64(): it must read the decimal number
    written, within [low, high]. A leading zero is octal to systemd: `07` is 7 either way, `010`
    has two readings (8 and 10), and `019` is refused."""
    read = c_integer(value, unsigned=unsigned)
    decimal = int(value) if re.fullmatch(r"[+-]?[0-9]+", value) else None
    if read is not None and read == decimal:
        return None if low <= read <= high else f"{value} is not {wanted}"
    if read is not None and low <= read <= high:
        if decimal is not None:
            return (
                f"systemd reads {_shown(value)} as octal {read}, not {decimal}: write {read}, or "
                f"{decimal} without the leading zero"
            )
        return f"systemd reads {_shown(value)} as {read}: write {read}"
    if decimal is not None and low <= decimal <= high:
        return (
            f"systemd refuses {_shown(value)} (a leading zero means octal to it) and would ignore the "
            f"line: write {decimal}"
        )
    return f"{_shown(value)} is not {wanted}"


def size_bytes(value: str) -> int | None:
    """The bytes parse_size(value, 1024) reads (a plain decimal count, K to E suffixes)."""
    match = _SIZE.fullmatch(value)
    return int(match[1]) * SIZE_SUFFIXES[match[2]] if match else None


def _percent_problem(value: str, wanted: str, *, zero: bool) -> str | None:
    """parse_permyriad(): at most 100%, with at most two decimals; `zero`: whether 0% is taken."""
    match = _PERCENT.fullmatch(value)
    if not match:
        return f"{_shown(value)} is not {wanted}"
    problem = _integer_problem(match[1], 0, 2**31 - 1, "a percentage")
    if problem:
        return problem
    permyriad = int(match[1]) * 100 + int((match[2] or "0").ljust(2, "0"))
    if permyriad > 10000:
        return f"{value} is over 100%, which systemd refuses (it would ignore the line)"
    if permyriad == 0 and not zero:
        return "0% is no memory at all, which systemd refuses (it would ignore the line)"
    return None


def cpu_list_problem(value: str, wanted: str) -> str | None:
    """CPUAffinity=, NUMAMask= (parse_cpu_set_full()): words split at whitespace and ',', each an
    index or a range (parse_range(): safe_atou(), base 0, so `010` is CPU 8). A range that counts
    down is dropped with only a warning ("Range '5-2' is invalid, 5 > 2, ignoring"); an index from
    CPU_INDEX_LIMIT on fails the whole line (cpu_set_add(): "Cannot add CPU")."""
    words = re.split(r"[ ,]", value)
    if not all(re.fullmatch(r"[0-9]+(-[0-9]+)?", word) for word in words):
        return f"{_shown(value)} is not {wanted}"
    for word in words:
        bounds = word.split("-")
        for number in bounds:
            problem = _integer_problem(number, 0, UINT64_MAX, "an index", unsigned=True)
            if problem:
                return problem
        low, high = int(bounds[0]), int(bounds[-1])
        if high >= CPU_INDEX_LIMIT:
            return (
                f"{high} is beyond systemd's last index, {CPU_INDEX_LIMIT - 1} (cpu_set_add()): it would "
                "drop the whole line"
            )
        if low > high:
            return (
                f"range {word!r} counts down, which systemd ignores with only a warning "
                f"('Range is invalid'): write {high}-{low}"
            )
    return None


def _indexes(value: str) -> set[int]:
    """The indexes of a CPU list cpu_list_problem() passed (none for "all", which is the host's)."""
    if value == "all":
        return set()
    bounds = [word.split("-") for word in re.split(r"[ ,]", value)]
    return {i for b in bounds for i in range(int(b[0]), int(b[-1]) + 1)}


# --- [Service] options the profile may set (service.limits, service.extra) ------------------------


def _memory(value: str) -> str | None:
    """MemoryMax=, MemoryHigh= (config_parse_memory_limit()): infinity, a percentage of RAM
    (parse_permyriad(), above 0%), or a size (parse_size()) from 1 byte to below UINT64_MAX;
    anything else is ignored with a warning ("Invalid memory limit", "out of range")."""
    wanted = "a size such as 512G, a percentage such as 90%, or infinity"
    if value == "infinity":
        return None
    if value.endswith("%"):
        return _percent_problem(value, wanted, zero=False)
    size = size_bytes(value)
    if size is None:
        return f"{_shown(value)} is not {wanted}"
    if not 0 < size < UINT64_MAX:
        return f"{value} is out of the range systemd takes (1 byte to 16E less one) and would be ignored"
    return None


def _tasks(value: str) -> str | None:
    """TasksMax= (config_parse_tasks_max()): infinity, a percentage of the kernel's limit
    (parse_permyriad()), or a count (safe_atou64(), base 0) from 1 to below UINT64_MAX."""
    wanted = "a count from 1, a percentage such as 50%, or infinity"
    if value == "infinity":
        return None
    if value.endswith("%"):
        return _percent_problem(value, wanted, zero=True)
    return _integer_problem(value, 1, UINT64_MAX - 1, wanted, unsigned=True)


def _rlimit_size(value: str) -> str | None:
    """A byte limit (rlimit_parse_size(): infinity, or parse_size() below RLIM_INFINITY)."""
    size = None if value == "infinity" else size_bytes(value)
    if value != "infinity" and (size is None or size >= UINT64_MAX):
        return f"{_shown(value)} is not a size such as 0, 8M or 64G (at most 16E less one), or infinity"
    return None


def _rlimit_count(value: str) -> str | None:
    """A count limit such as LimitNOFILE= (rlimit_parse_u64(): infinity, or safe_atou64() below
    RLIM_INFINITY; no size suffix: `1G` is "Failed to parse resource value, ignoring")."""
    if value == "infinity":
        return None
    wanted = "a count such as 65536 (no size suffix, below 2^64 - 1), or infinity"
    return _integer_problem(value, 0, UINT64_MAX - 1, wanted, unsigned=True)


def _seconds_text(value: str) -> str | None:
    """TimeoutAbortSec= (parse_sec()): infinity, or whole seconds below SECONDS_LIMIT (strtoll(),
    base 10: a leading zero is no octal here)."""
    if value == "infinity":
        return None
    if not re.fullmatch(r"\+?[0-9]+", value) or int(value) >= SECONDS_LIMIT:
        return f"{_shown(value)} is not whole seconds below {SECONDS_LIMIT}, or infinity"
    return None


def _umask(value: str) -> str | None:
    """UMask= (parse_mode(): safe_atou_full() in base 8, no sign, up to 07777): octal digits, as
    systemd.exec(5) says; `27` is 0027."""
    if re.fullmatch("[0-7]+", value) and int(value, 8) <= 0o7777:
        return None
    return f"{_shown(value)} is not an octal mask such as 0027 (at most 07777)"


def _one_of(*words: str) -> Callable[[str], str | None]:
    """A value from a string table (ioprio_class_from_string(), sched_policy_from_string(), ...)."""

    def check(value: str) -> str | None:
        return None if value in words else f"{_shown(value)} is not {', '.join(words[:-1])} or {words[-1]}"

    return check


def _integer(low: int, high: int, *, unsigned: bool = False) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return _integer_problem(value, low, high, f"an integer from {low} to {high}", unsigned=unsigned)

    return check


#: Directives a site may add under service.extra, each with the check of what systemd 252 does
#: with its value (systemd.exec(5), systemd.resource-control(5)): a value it would refuse, ignore
#: or read otherwise is refused here rather than found out on the host after the server stopped.
EXTRA_DIRECTIVES: dict[str, Callable[[str], str | None]] = {
    "CPUAffinity": lambda v: cpu_list_problem(v, "CPU indexes and ranges, e.g. '0-31,64-95'"),
    "NUMAPolicy": _one_of("default", "preferred", "bind", "interleave", "local"),
    "NUMAMask": lambda v: (
        None if v == "all" else cpu_list_problem(v, "NUMA node indexes and ranges, e.g. '0-1', or 'all'")
    ),
    # parse_nice(), parse_oom_score_adjust(), ioprio_parse_priority(): safe_atoi() and a range.
    "Nice": _integer(-20, 19),
    "OOMScoreAdjust": _integer(-1000, 1000),
    "IOSchedulingClass": _one_of("realtime", "best-effort", "idle", "none"),
    "IOSchedulingPriority": _integer(0, 7),
    "CPUSchedulingPolicy": _one_of("other", "batch", "idle", "fifo", "rr"),
    # cg_cpu_weight_parse(): idle, or safe_atou64() from CGROUP_WEIGHT_MIN to CGROUP_WEIGHT_MAX.
    "CPUWeight": lambda v: None if v == "idle" else _integer(1, 10000, unsigned=True)(v),
    "MemoryMax": _memory,
    "MemoryHigh": _memory,
    "TasksMax": _tasks,
    "LimitCORE": _rlimit_size,
    "LimitSTACK": _rlimit_size,
    "UMask": _umask,
    "TimeoutAbortSec": _seconds_text,
}
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
#: service.limits: what config_parse_rlimit() takes for each.
LIMITS = {"LimitMEMLOCK": _rlimit_size, "LimitNOFILE": _rlimit_count}


def limit_problem(directive: str, value: str) -> str | None:
    """A service.limits value (LimitMEMLOCK=, LimitNOFILE=) as config_parse_rlimit() reads it."""
    return LIMITS[directive](value)


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
    return EXTRA_DIRECTIVES[name](value)


def extra_combination_problems(extra: dict[str, str]) -> list[str]:
    """service.extra directives that are each valid but change or break each other.

    - IOSchedulingClass=none is best-effort at priority 4 to systemd (ioprio_normalize()), which
      replaces an IOSchedulingPriority= on an earlier line without a word;
    - numa_policy_is_valid(), which the server's start runs (apply_numa_policy(): "Failed to set
      NUMA memory policy", the unit fails): bind and interleave need a NUMAMask=; preferred, which
      a NUMAMask= without NUMAPolicy= means, takes exactly one node; and the kernel's
      set_mempolicy() refuses a mask with default or local (EINVAL).
    """
    problems = []
    if extra.get("IOSchedulingClass") == "none" and "IOSchedulingPriority" in extra:
        problems.append(
            "IOSchedulingClass: none is best-effort at priority 4 to systemd, which drops "
            "IOSchedulingPriority when it comes first: write best-effort, or drop IOSchedulingPriority"
        )
    policy, mask = extra.get("NUMAPolicy"), extra.get("NUMAMask")
    if policy in ("bind", "interleave") and mask is None:
        problems.append(f"NUMAPolicy: {policy} needs a NUMAMask (the server would fail to start)")
    if mask is not None and policy in ("default", "local"):
        problems.append(f"NUMAMask: NUMAPolicy {policy} takes no mask (the server would fail to start)")
    if mask is not None and policy in (None, "preferred") and len(_indexes(mask)) != 1:
        problems.append(
            "NUMAMask: NUMAPolicy preferred (what a NUMAMask alone means) takes exactly one node, "
            "e.g. NUMAMask: '1' (the server would fail to start); or set NUMAPolicy: bind"
        )
    return problems


# --- seconds (service.restart_sec) --------------------------------------------------------------

_MICROSECOND = Decimal("0.000001")


def seconds(value: float) -> str:
    """A number of seconds as parse_sec() reads it: plain decimals, never an exponent (`1e-05` is
    "Failed to parse sec value, ignoring")."""
    return format(Decimal(repr(float(value))).normalize(), "f")


def seconds_problem(value: float) -> str | None:
    """parse_time() counts whole microseconds and drops any further digit without a word, so a
    finer value would silently be another one."""
    exact = Decimal(repr(float(value)))
    kept = exact.quantize(_MICROSECOND, rounding=ROUND_DOWN)
    if exact == kept:
        return None
    return (
        f"{seconds(value)} s is finer than systemd's microsecond: it would read "
        f"{format(kept.normalize(), 'f')} s; write that, or a value in whole microseconds"
    )


# --- what can reach the process -----------------------------------------------------------------

#: MAX_ARG_STRLEN (linux/binfmts.h, 32 pages): execve() refuses any one argument or environment
#: string longer than this, its NUL included, with E2BIG; the unit starts and fails at once.
MAX_ARG_STRLEN = 32 * 4096
#: LONG_LINE_MAX (src/basic/fileio.h): config_parse() refuses a line of this many bytes or more
#: (read_line(): "Line too long") and continuation lines joined to more than this ("Continuation
#: line too long"); the whole unit then fails to load, "No buffer space available".
LONG_LINE_MAX = 1024 * 1024
#: execve()'s room for argv and the environment (fs/exec.c bprm_stack_limits()): a quarter of the
#: stack limit, at most 3/4 of _STK_LIM and at least ARG_MAX (32 pages). A service's stack limit is
#: the kernel's 8 MiB unless LimitSTACK= says otherwise.
DEFAULT_STACK = 8 * 1024 * 1024
#: Room kept for what systemd adds to the environment (PATH, INVOCATION_ID, JOURNAL_STREAM, HOME,
#: CREDENTIALS_DIRECTORY, ...) and the unit's EnvironmentFile=, which the plan does not hold.
EXEC_HEADROOM = 16 * 1024


def argument_problem(text: str, what: str) -> str | None:
    """One argv word or `NAME=value` environment string against MAX_ARG_STRLEN."""
    size = len(text.encode(errors="surrogateescape")) + 1
    if size <= MAX_ARG_STRLEN:
        return None
    return (
        f"makes {what} of {size} bytes with its NUL, over the kernel's MAX_ARG_STRLEN of {MAX_ARG_STRLEN} "
        "(128 KiB): execve() would fail with E2BIG; shorten it"
    )


def unit_lines(unit: str) -> list[tuple[int, str, int, int]]:
    """Each line of a unit as config_parse() reads it: (number of its first physical line, its
    directive, bytes of the joined line, bytes of its longest physical line). A physical line
    ending in an odd count of backslashes continues on the next."""
    lines: list[tuple[int, str, int, int]] = []
    first: tuple[int, str] | None = None
    joined = longest = 0
    for number, line in enumerate(unit.split("\n"), 1):
        first = first or (number, line)
        size = len(line.encode(errors="surrogateescape"))
        joined, longest = joined + size, max(longest, size)
        if (len(line) - len(line.rstrip("\\"))) % 2:
            continue
        lines.append((first[0], first[1].partition("=")[0].strip(), joined, longest))
        first, joined, longest = None, 0, 0
    return lines


def line_problem(directive: str, joined: int, longest: int) -> str | None:
    """A unit line against LONG_LINE_MAX: physical lines below it, a continued one at most it."""
    if longest < LONG_LINE_MAX and joined <= LONG_LINE_MAX:
        return None
    return (
        f"makes the unit's {directive}= line {max(joined, longest)} bytes long, over systemd's LONG_LINE_MAX "
        f"of {LONG_LINE_MAX} (1 MiB): systemd would refuse the whole unit ('No buffer space available'); "
        "shorten it"
    )


def exec_room(stack: str | None) -> int:
    """Bytes execve() takes for argv and environment under LimitSTACK= `stack` (None: not set)."""
    size = DEFAULT_STACK if stack is None else size_bytes(stack)
    if stack == "infinity" or size is None:
        size = UINT64_MAX
    return max(min(8 * 1024 * 1024 // 4 * 3, size // 4), MAX_ARG_STRLEN)


def exec_size_problem(argv: list[str], environ: list[str], room: int) -> str | None:
    """argv and environment strings with their NULs and pointers (and the executable's path,
    which execve() copies too) against `room`, less EXEC_HEADROOM."""
    strings = [argv[0], *argv, *environ]
    size = sum(len(s.encode(errors="surrogateescape")) + 1 for s in strings) + 8 * (len(argv) + len(environ))
    if size <= room - EXEC_HEADROOM:
        return None
    return (
        f"makes the server's arguments and environment {size} bytes, over what execve() takes: {room} "
        f"bytes (a quarter of the stack limit, at most 6 MiB), less {EXEC_HEADROOM} kept for what "
        "systemd adds; it would fail with E2BIG: shorten the largest values"
    )
