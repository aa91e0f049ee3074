"""A live server -> a profile that renders its command, and the proof that it does.

`adopt` reads the command line and environment of a server started by hand back into a profile:
- Each option is read with SGLang's own argparse tables for the host's version
  (sglang_flags.read_args), so aliases, unique prefixes and `=` forms resolve as on the host.
- An option the renderer writes for a field goes back to that field. Every other option goes to
  server.extra_args, word for word.
- NCCL variables go to `nccl:`, CUDA_VISIBLE_DEVICES to server.gpus, secrets to files the user
  creates, the rest to `env:`. The login shell's variables are left out, each with its reason.

`compare` renders a profile with launch.py's own functions and sets its argv and environment beside
the live ones. A difference SGLang's argparse reads alike (a spelling, the order, a default made
explicit) is harmless, with its reason. Any other is not.

Secret values never reach this module: the host replaced each by SECRET. The profile names a file
for each (`secrets/<profile>/...`, relative to where orchestrator runs, as api_key.file is read).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from orchestrator.errors import ProfileError
from orchestrator.profile import sglang_flags, sglang_rules, systemd_rules
from orchestrator.profile.model import (
    Adaptive,
    Disaggregation,
    Profile,
    Server,
    Service,
    Speculative,
    cache_directory,
    validate,
)
from orchestrator.render.launch import CACHE_ROOT, COMPILE_CACHES, Plan, build

#: What the host writes in place of a secret value, on argv and in the environment.
SECRET = "<secret>"
#: Where the adopted profile's secret files are, relative to the directory orchestrator runs in
#: (hosts/secrets.py reads api_key.file as written): secrets/<profile>/<name>.
SECRETS_DIR = "secrets"


@dataclass(frozen=True)
class Live:
    """What the host read of a running server. Secret values are SECRET already."""

    argv: list[str]
    env: dict[str, str]
    #: Each redacted value's name (the flag as SGLang names it, `--api-key`, or the variable) -> its sha256.
    secrets: dict[str, str]
    #: argv[0], made absolute.
    python: str
    cwd: str
    user: str
    #: `python -m sglang.launch_server`, or `sglang serve` (argv: python, the script, `serve`, ...).
    entry: Literal["module", "serve"]
    host: str
    pid: int
    #: The user's home and login shell from its passwd entry, which systemd's User= sets as $HOME
    #: and $SHELL. None: not read (root's home is taken as /root).
    passwd_home: str | None = None
    passwd_shell: str | None = None
    #: The service manager's $PATH (`systemctl show-environment`). None: not read; then one of
    #: SYSTEMD_PATHS counts as systemd's.
    systemd_path: str | None = None
    #: The text of the --speculative-adaptive-config file, when the host read it.
    adaptive_config: str | None = None


@dataclass
class Adoption:
    """The profile of a live server, or why there is none. Write `data` only without problems."""

    #: The profile as YAML-ready data: only what differs from the defaults, plus server.sglang_version,
    #: server.python and server.model_path. No `name`: the file's stem names it.
    data: dict[str, Any]
    #: The redacted name (as in Live.secrets) -> the file the user creates with that value.
    secret_files: dict[str, str] = field(default_factory=dict)
    #: Variables left out of the profile -> why.
    left_out: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: What makes the adoption impossible. Each is one line; none echoes a secret.
    problems: list[str] = field(default_factory=list)
    #: The validated profile, when there are no problems.
    profile: Profile | None = None


@dataclass(frozen=True)
class Difference:
    """One word or variable where the rendered command differs from the live one."""

    kind: Literal["argv", "env"]
    what: str
    live: str | None
    rendered: str | None
    reason: str
    #: SGLang, NCCL and Python run the same either way.
    harmless: bool


# --- the flag mapping ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    """Where a modelled setting's value goes in a profile."""

    section: Literal["server", "speculative", "disaggregation"]
    name: str
    #: The field's value when the flag, a bare switch, is given; None: the flag's value.
    switch: bool | None = None


#: Each MODELLED setting that is one profile field, read back from its flag.
FIELDS: dict[str, _Field] = {
    "model_path": _Field("server", "model_path"),
    "served_model_name": _Field("server", "served_model_name"),
    "tp_size": _Field("server", "tp_size"),
    "dp_size": _Field("server", "dp_size"),
    "host": _Field("server", "host"),
    "port": _Field("server", "port"),
    "mem_fraction_static": _Field("server", "mem_fraction_static"),
    "context_length": _Field("server", "context_length"),
    "trust_remote_code": _Field("server", "trust_remote_code", True),
    "disable_cuda_graph": _Field("server", "cuda_graph", False),
    "cuda_graph_max_bs": _Field("server", "cuda_graph_max_bs"),
    "log_level": _Field("server", "log_level"),
    "enable_metrics": _Field("server", "enable_metrics", True),
    "speculative_algorithm": _Field("speculative", "algorithm"),
    "speculative_draft_model_path": _Field("speculative", "draft_model_path"),
    "speculative_num_steps": _Field("speculative", "num_steps"),
    "speculative_eagle_topk": _Field("speculative", "eagle_topk"),
    "speculative_num_draft_tokens": _Field("speculative", "num_draft_tokens"),
    "disaggregation_mode": _Field("disaggregation", "mode"),
    "disaggregation_transfer_backend": _Field("disaggregation", "transfer_backend"),
    "disaggregation_bootstrap_port": _Field("disaggregation", "bootstrap_port"),
    "disaggregation_ib_device": _Field("disaggregation", "ib_device"),
}
#: The other MODELLED settings, each read by _apart: no field of its own holds it.
APART = (
    "speculative_adaptive",
    "speculative_adaptive_config",
    "config",
    "nnodes",
    "node_rank",
    "dist_init_addr",
)

#: SGLang's defaults (ServerArgs) of the settings the renderer writes whatever the profile says
#: (host, port, tp_size), or leaves out at their default (dp_size 1, one node). The help texts show
#: no defaults, so compare fills these in both namespaces.
SGLANG_DEFAULTS: dict[str, object] = {
    "host": "127.0.0.1",
    "port": 30000,
    "tp_size": 1,
    "dp_size": 1,
    "nnodes": 1,
    "node_rank": 0,
}


@cache
def _settings(shipped: str) -> dict[str, str]:
    """Option (its first name) -> the MODELLED setting whose flag it is, in one shipped help."""
    table = sglang_flags.flag_table(shipped)
    out = {}
    for setting in sglang_flags.MODELLED:
        spelled = sglang_flags.flag(setting, shipped)
        opt = table.option(spelled) if spelled else None
        if opt is not None:
            out[opt.names[0]] = setting
    return out


def _setting_of(version: str, opt: sglang_flags.OptionSpec) -> str | None:
    return _settings(sglang_flags.help_version(version)).get(opt.names[0])


@cache
def _full_parser(shipped: str) -> argparse.ArgumentParser:
    return sglang_flags.build_parser(sglang_flags.flag_table(shipped), raising=True)


# --- the environment ------------------------------------------------------------------------

#: Variables of the login shell or session that started the server, which a unit neither has nor needs.
SHELL_VARIABLES = {
    "PWD": "the login shell's (the unit's WorkingDirectory= sets the directory)",
    "OLDPWD": "the login shell's",
    "SHLVL": "the login shell's",
    "_": "the login shell's (the last command it ran)",
    "HOSTNAME": "the login shell's",
    "HISTSIZE": "the login shell's",
    "HISTFILESIZE": "the login shell's",
    "LS_COLORS": "the login shell's",
    "LESSOPEN": "the login shell's",
    "LESSCLOSE": "the login shell's",
    "TERM": "the terminal's",
    "COLORTERM": "the terminal's",
    "COLUMNS": "the terminal's",
    "LINES": "the terminal's",
    "MAIL": "the login session's",
    "MOTD_SHOWN": "the login session's",
    "XDG_RUNTIME_DIR": "the login session's",
    "DBUS_SESSION_BUS_ADDRESS": "the login session's",
    "DISPLAY": "the desktop session's",
    "STY": "screen's",
    "WINDOW": "screen's",
}
SHELL_PREFIXES = {
    "SSH_": "the SSH session's",
    "TERM_PROGRAM": "the terminal's",
    "TMUX": "tmux's",
    "XDG_SESSION_": "the login session's",
    "SUDO_": "sudo's, for the command it ran",
    "BASH_FUNC_": "the login shell's (an exported function)",
}
#: Variables systemd sets for a service (systemd.exec(5)): from a unit the server ran in, which
#: the new unit sets for itself.
SYSTEMD_VARIABLES = frozenset(
    """
    INVOCATION_ID JOURNAL_STREAM SYSTEMD_EXEC_PID MANAGERPID MAINPID NOTIFY_SOCKET WATCHDOG_PID
    WATCHDOG_USEC LISTEN_FDS LISTEN_PID LISTEN_FDNAMES RUNTIME_DIRECTORY STATE_DIRECTORY CACHE_DIRECTORY
    LOGS_DIRECTORY CONFIGURATION_DIRECTORY CREDENTIALS_DIRECTORY MEMORY_PRESSURE_WATCH
    MEMORY_PRESSURE_WRITE TRIGGER_UNIT TRIGGER_PATH TRIGGER_TIMER_REALTIME_USEC
    TRIGGER_TIMER_MONOTONIC_USEC
    """.split()  # noqa: SIM905 (a word list reads better than 25 quoted strings)
)
#: The system manager's $PATH for services (systemd's default_PATH(), src/basic/path-util.h): with
#: split /usr builds (Debian 12, Ubuntu 22.04), then plain, then with /usr/sbin or all sbin merged
#: (v256 on). Used when Live.systemd_path was not read.
SYSTEMD_PATHS = (
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
    "/usr/local/sbin:/usr/local/bin:/usr/bin",
    "/usr/local/bin:/usr/bin",
)
_PLAIN_GPUS = re.compile(r"(0|[1-9][0-9]*)(,(0|[1-9][0-9]*))*")


def _left_out(live: Live, name: str, value: str) -> str | None:
    """Why the variable stays out of the profile, or None when the unit must set it."""
    if name in SHELL_VARIABLES:
        return SHELL_VARIABLES[name]
    prefix = next((p for p in SHELL_PREFIXES if name.startswith(p)), None)
    if prefix is not None:
        return SHELL_PREFIXES[prefix]
    if name in SYSTEMD_VARIABLES:
        return "systemd's, for the unit the server ran in; the new unit gets its own"
    home = live.passwd_home or ("/root" if live.user == "root" else None)
    given = {"USER": live.user, "LOGNAME": live.user, "HOME": home, "SHELL": live.passwd_shell}
    if name in given and value == given[name]:
        return f"systemd's User={live.user} sets it to the same"
    paths = (live.systemd_path,) if live.systemd_path is not None else SYSTEMD_PATHS
    if name == "PATH" and value in paths:
        return "systemd's own PATH for services is the same"
    return None


# --- adopt -----------------------------------------------------------------------------------


@dataclass
class _Draft:
    """What adopt has read so far."""

    name: str
    unit_name: str
    server: dict[str, Any] = field(default_factory=dict)
    speculative: dict[str, Any] = field(default_factory=dict)
    disaggregation: dict[str, Any] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    adaptive_file: dict[str, Any] = field(default_factory=dict)
    nccl: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, dict[str, str]] = field(default_factory=dict)
    service: dict[str, Any] = field(default_factory=dict)
    api_key: dict[str, str] | None = None
    out: Adoption = field(default_factory=lambda: Adoption({}))

    def secret_file(self, key: str, file: str) -> dict[str, str]:
        path = f"{SECRETS_DIR}/{self.name}/{file}"
        self.out.secret_files[key] = path
        return {"file": path}


def adopt(live: Live, *, name: str, version: str, unit_name: str = "sglang.service") -> Adoption:
    """The profile `name` that renders `live`'s command for SGLang `version` in the unit
    `unit_name`, or its problems."""
    draft = _Draft(name, unit_name)
    problem = sglang_flags.version_problem(version)
    if problem:
        draft.out.problems.append(problem)
        return draft.out
    draft.out.problems += _text_problems(live)
    entry = _entry(live)
    draft.out.notes += entry.notes
    draft.out.problems += entry.problems
    if not entry.problems:
        _read_options(draft, live, entry.words, version)
    _read_env(draft, live)
    _read_service(draft, live)
    draft.out.data = _assemble(draft, live, version)
    if not draft.out.problems:
        draft.out.profile = _validated(draft.out, name, live)
    return draft.out


def _text_problems(live: Live) -> list[str]:
    """Words the unit cannot carry as they are: not UTF-8, or refused by systemd."""
    named = [(f"argv word {i}", word) for i, word in enumerate(live.argv)]
    named += [("the working directory", live.cwd), ("the Python path", live.python)]
    return [p for where, text in named if (p := _text_problem(where, text))]


def _text_problem(where: str, text: str) -> str | None:
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        return f"{where} is not UTF-8: a unit and a profile hold text only"
    if "\0" in text:
        return f"{where} holds a NUL character"
    odd = systemd_rules.noncharacter(text)
    if odd:
        return f"{where} holds U+{ord(odd):04X}, a Unicode noncharacter, which systemd refuses"
    return None


@dataclass
class _Entry:
    """How the server was started: the words before SGLang's options, and those options."""

    head: list[str]
    words: list[str]
    #: Python's own options before `-m` (only -u is taken).
    interpreter: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _entry(live: Live) -> _Entry:
    argv = live.argv
    if live.entry == "serve":
        return _serve_entry(argv)
    at = argv.index("-m", 1) if "-m" in argv[1:] else None
    if at is None or argv[at + 1 : at + 2] != ["sglang.launch_server"]:
        shown = " ".join(argv[:3])
        return _Entry(argv[:3], [], problems=[f"{shown!r} is not `python -m sglang.launch_server`"])
    entry = _Entry(argv[: at + 2], argv[at + 2 :], interpreter=argv[1:at])
    odd = [w for w in entry.interpreter if w != "-u"]
    if odd:
        entry.problems.append(
            f"Python options {' '.join(odd)!r} before -m: the unit runs `python -m sglang.launch_server` "
            "without them; start the server without them, then adopt it"
        )
    elif entry.interpreter:
        entry.notes.append("python -u: the unit sets PYTHONUNBUFFERED=1, which does the same")
    return entry


def _serve_entry(argv: list[str]) -> _Entry:
    """`sglang serve`: for a language model it runs launch_server's own parser and server
    (sglang/cli/serve.py _run_llm), after taking out --model-type and a leading model path."""
    at = next((i for i in (1, 2) if argv[i : i + 1] == ["serve"]), None)
    if at is None:
        return _Entry(argv[:3], [], problems=[f"{' '.join(argv[:3])!r} is not `sglang serve`"])
    entry = _Entry(argv[: at + 1], [])
    words = list(argv[at + 1 :])
    backend = "auto"
    while any(w == "--model-type" or w.startswith("--model-type=") for w in words):
        i = next(i for i, w in enumerate(words) if w == "--model-type" or w.startswith("--model-type="))
        taken = 2 if words[i] == "--model-type" else 1
        backend = words[i].partition("=")[2] if taken == 1 else (words[i + 1 : i + 2] or [""])[0]
        del words[i : i + taken]
    if backend not in ("auto", "llm"):
        entry.problems.append(f"--model-type {backend!r}: only a language model (llm) runs as launch_server")
    if words and not words[0].startswith("-"):
        words = ["--model-path", *words]
        entry.notes.append("the model path given first to `sglang serve` is written as --model-path")
    entry.words = words
    entry.notes.append(
        "started as `sglang serve`; the unit runs `python -m sglang.launch_server` with the same options, "
        "which is what `sglang serve` runs for a language model"
    )
    return entry


def _read_options(draft: _Draft, live: Live, words: list[str], version: str) -> None:
    """Each option to its field, to extra_args, or to a problem."""
    given: dict[str, list[sglang_flags.ExtraArg]] = {}
    for arg in sglang_flags.read_args(version, words):
        problem = _refused(arg, version)
        if problem:
            draft.out.problems.append(problem)
            continue
        assert arg.option is not None
        given.setdefault(arg.option.names[0], []).append(arg)
        setting = _setting_of(version, arg.option)
        if set(arg.option.names) & set(sglang_flags.SECRET_FLAGS):
            _secret_flag(draft, arg.option.names[0])
        elif setting is None:
            draft.extra += arg.words
        elif setting in FIELDS:
            spot = FIELDS[setting]
            section = {
                "server": draft.server,
                "speculative": draft.speculative,
                "disaggregation": draft.disaggregation,
            }[spot.section]
            section[spot.name] = arg.value if spot.switch is None else spot.switch
        else:
            _apart(draft, live, setting, arg)
    if "model_path" not in draft.server:
        draft.out.problems.append("no --model-path: the profile needs the model's path")
    if draft.adaptive_file and "adaptive" not in draft.speculative:
        draft.out.problems.append(
            "--speculative-adaptive-config without --speculative-adaptive: SGLang does not read it, and a "
            "profile writes it only with speculative.adaptive; start the server without it, then adopt it"
        )
    draft.out.notes += [_repeated(k, args, version) for k, args in given.items() if len(args) > 1]
    if draft.disaggregation.get("mode", "null") == "null":
        if set(draft.disaggregation) - {"mode"}:
            draft.out.problems.append(
                "--disaggregation-* flags without --disaggregation-mode prefill or decode: SGLang does not "
                "use them; start the server without them, then adopt it"
            )
        draft.disaggregation = {}


def _repeated(key: str, args: list[sglang_flags.ExtraArg], version: str) -> str:
    opt = args[-1].option
    assert opt is not None
    if set(opt.names) & set(sglang_flags.SECRET_FLAGS):
        return f"{key} is given {len(args)} times: argparse keeps the last"
    if _setting_of(version, opt) is None:
        return f"{key} is given {len(args)} times: extra_args keeps each as written; argparse keeps the last"
    last = " ".join(args[-1].words)
    return f"{key} is given {len(args)} times: argparse keeps the last ({last}), as the profile does"


def _refused(arg: sglang_flags.ExtraArg, version: str) -> str | None:
    """Why the option's words cannot be adopted, or None. No secret value is echoed."""
    if arg.option is None and arg.unknown:
        return (
            f"{arg.name} is not a flag of {sglang_flags.named(version)}: its argparse refuses it; is the "
            f"host's SGLang {version}?"
        )
    if arg.error is not None:
        word = arg.name.lstrip("-")
        secret = any(f.lstrip("-").startswith(word) for f in sglang_flags.SECRET_FLAGS)
        why = "" if secret else f": {arg.error}"
        return f"{arg.name}: {sglang_flags.named(version)}'s argparse refuses it{why}"
    if arg.option is None or arg.stray:
        count = len(arg.stray) or len(arg.words)
        return f"{count} stray word(s) after {arg.name}: SGLang takes no positional words"
    if "--help" in arg.option.names:
        return f"{arg.name} prints SGLang's help and exits: this is no running server's command"
    return None


def _secret_flag(draft: _Draft, key: str) -> None:
    if key == "--api-key":
        draft.api_key = draft.secret_file(key, "api_key")
        return
    draft.out.problems.append(
        f"{key} carries a secret the profile cannot hold: only --api-key has a field (api_key), and "
        "extra_args takes no secret (argv and the unit are world-readable)"
    )


def _apart(draft: _Draft, live: Live, setting: str, arg: sglang_flags.ExtraArg) -> None:
    """The modelled settings that are no profile field of their own."""
    value = arg.value
    if setting == "speculative_adaptive":
        draft.speculative["adaptive"] = {}
    elif setting == "speculative_adaptive_config":
        _adaptive_config(draft, live, str(value))
    elif setting == "config":
        draft.out.problems.append(
            f"{arg.name} {value}: a config file of the server's own, which a profile cannot carry "
            "(orchestrator writes --config only for api_key); put its settings on the command line, "
            "then adopt it"
        )
    elif setting in ("nnodes", "node_rank") and value == SGLANG_DEFAULTS[setting]:
        draft.out.notes.append(f"{' '.join(arg.words)} is SGLang's default: left out")
    elif setting == "nnodes":
        draft.out.problems.append(
            f"{' '.join(arg.words)}: a multi-node server; adopt takes a one-host server only (write a "
            "multinode profile, deployment.kind: multinode, by hand)"
        )
    else:
        draft.out.problems.append(
            f"{' '.join(arg.words)}: orchestrator writes {arg.name} only for a multinode deployment, "
            "from the hosts it selects"
        )


def _adaptive_config(draft: _Draft, live: Live, path: str) -> None:
    """--speculative-adaptive-config: its tiers and knobs, from the file's text the host read."""
    if live.adaptive_config is None:
        draft.out.problems.append(
            f"--speculative-adaptive-config {path}: its file was not read, so its tiers cannot be written "
            "as speculative.adaptive.tiers"
        )
        return
    read, problem = adaptive_settings(live.adaptive_config)
    if problem:
        draft.out.problems.append(f"--speculative-adaptive-config {path}: {problem}")
        return
    draft.adaptive_file = read
    draft.out.notes.append(
        f"--speculative-adaptive-config {path}: its settings are speculative.adaptive's; the unit hands "
        "the server its own copy of them"
    )


def adaptive_settings(text: str) -> tuple[dict[str, Any], str | None]:
    """speculative.adaptive's tiers and knobs from a --speculative-adaptive-config JSON (the inverse
    of launch.adaptive_config), or why the profile cannot write it."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}, "is not JSON"
    if not isinstance(data, dict):
        return {}, "is not a JSON object"
    knobs = [k for k in Adaptive.model_fields if k != "tiers"]
    tiers: dict[int, Any] = {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key.isascii() and key.isdigit():
            if not isinstance(value, dict) or set(value) != {"candidate_steps"}:
                return {}, f"tier {key} holds more than candidate_steps, which a profile cannot write"
            tiers[int(key)] = value["candidate_steps"]
        elif key in knobs:
            out[key] = value
        else:
            return {}, f"{key!r} is no setting a profile writes (tiers, {', '.join(knobs)})"
    return ({"tiers": tiers} if tiers else {}) | out, None


def _read_env(draft: _Draft, live: Live) -> None:
    for name, value in live.env.items():
        why = _left_out(live, name, value)
        if why is not None:
            draft.out.left_out[name] = why
            continue
        problem = _text_problem(f"variable {name!r}", name) or _text_problem(f"the value of {name!r}", value)
        if problem:
            draft.out.problems.append(problem)
        elif name.startswith("NCCL_") and value == SECRET:
            draft.out.problems.append(
                f"{name} was redacted: NCCL variables are no secrets, nccl: needs its value"
            )
        elif name.startswith("NCCL_"):
            draft.nccl[name] = value
        elif name == "CUDA_VISIBLE_DEVICES":
            _gpus(draft, value)
        elif value == SECRET or sglang_rules.looks_secret(name):
            draft.secret_env[name] = draft.secret_file(name, name)
        elif not (name == "PYTHONUNBUFFERED" and value == "1"):  # the unit sets that itself
            draft.env[name] = value
    if "PYTHONUNBUFFERED" not in live.env:
        draft.out.notes.append(
            "the unit adds PYTHONUNBUFFERED=1, so crash logs reach the journal: output is unbuffered, "
            "nothing else changes"
        )
    _compile_cache(draft, live)


def _gpus(draft: _Draft, value: str) -> None:
    if _PLAIN_GPUS.fullmatch(value):
        draft.server["gpus"] = [int(g) for g in value.split(",")]
        return
    draft.out.problems.append(
        f"CUDA_VISIBLE_DEVICES={value!r} is not a list of GPU indexes such as 0,1,2,3, which server.gpus "
        "writes; start the server with indexes, then adopt it"
    )


def _compile_cache(draft: _Draft, live: Live) -> None:
    """service.compile_cache stays on only where the live environment has all its variables and
    some at the unit's own cache directory; else it is off, so the render adds none of them."""
    # cache_directory's own rule, on the unit's name (nothing else of the profile counts).
    unit = Service.model_construct(unit_name=draft.unit_name)
    folder = cache_directory(
        Profile.model_construct(name="", server=Server.model_construct(model_path="/"), service=unit)
    )
    own = {name: f"{CACHE_ROOT}/{folder}/{sub}" for name, sub in COMPILE_CACHES.items()}
    if all(name in live.env for name in own) and any(live.env[n] == path for n, path in own.items()):
        for name, path in own.items():
            if draft.env.get(name) == path:
                del draft.env[name]
        return
    draft.service["compile_cache"] = False
    draft.out.notes.append(
        "service.compile_cache is off, so the unit's environment is the live one; turn it on to keep the "
        f"JIT and compile caches across restarts in {CACHE_ROOT}/{folder} (the first start compiles again)"
    )


def _read_service(draft: _Draft, live: Live) -> None:
    draft.service["unit_name"] = draft.unit_name
    if live.user != "root":
        draft.service["user"] = live.user
    if live.cwd != "/":
        draft.service["working_directory"] = live.cwd


def _assemble(draft: _Draft, live: Live, version: str) -> dict[str, Any]:
    """The profile's data in the example profiles' order, defaults left out."""
    server = {"sglang_version": version, "python": live.python, **draft.server}
    if draft.extra:
        server["extra_args"] = draft.extra
    spec = dict(draft.speculative)
    if "adaptive" in spec:
        tiers = draft.adaptive_file
        spec["adaptive"] = {k: tiers[k] for k in Adaptive.model_fields if k in tiers}
    data: dict[str, Any] = {
        "description": f"Adopted from {live.host} PID {live.pid} ({live.user}, started by hand)",
        "server": _minimal(Server, server, keep=frozenset({"sglang_version", "python", "model_path"})),
        "speculative": _minimal(Speculative, spec),
        "disaggregation": _minimal(Disaggregation, draft.disaggregation, keep=frozenset({"mode"})),
        "nccl": draft.nccl,
        "env": draft.env,
        "service": _minimal(Service, draft.service),
        "api_key": draft.api_key,
        "secret_env": draft.secret_env,
    }
    return {key: value for key, value in data.items() if value}


def _minimal(
    section: type[Server] | type[Speculative] | type[Service] | type[Disaggregation],
    values: dict[str, Any],
    keep: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """`values` in the model's field order, without those at the field's default."""
    out = {}
    for name, info in section.model_fields.items():
        if name in values and (name in keep or values[name] != info.get_default(call_default_factory=True)):
            out[name] = values[name]
    return out


def _validated(out: Adoption, name: str, live: Live) -> Profile | None:
    """The profile through the project's own validation and plan, or None with the problems."""
    try:
        profile = validate({"name": name, **out.data}, source=f"{live.host} PID {live.pid}")
        build(profile)  # what cannot reach the server: argument and line lengths
    except ProfileError as exc:
        out.problems += [f"{p.loc}: {p.message}" if p.loc else p.message for p in exc.problems]
        return None
    return profile


# --- compare ---------------------------------------------------------------------------------


def compare(subject: Profile | Plan, live: Live, version: str) -> list[Difference]:
    """Every word and variable where `subject`'s render differs from `live`, each judged with its
    reason. With a Plan, a secret variable missing from Environment= counts as the EnvironmentFile='s
    when the plan has one; with a Profile, only when its secret_env names it."""
    if isinstance(subject, Profile):
        plan, secret_names = build(subject), set(subject.secret_env)
    else:
        plan, secret_names = subject, None
    return [*_argv_differences(plan, live, version), *_env_differences(plan, live, secret_names)]


def _argv_differences(plan: Plan, live: Live, version: str) -> list[Difference]:
    entry = _entry(live)
    if entry.problems:
        head = " ".join(plan.argv[:3])
        return [Difference("argv", "entry", " ".join(entry.head), head, entry.problems[0], False)]
    out = _prefix_differences(plan, live, entry)
    rendered = plan.started_argv()[3:]
    if entry.words == rendered:
        return out
    parser = _full_parser(sglang_flags.help_version(version))
    namespaces = []
    for side, words in (("live", entry.words), ("rendered", rendered)):
        try:
            namespaces.append(_filled(vars(parser.parse_args(words)), version))
        except sglang_flags.ArgError:  # its message may hold a value the host did not redact
            why = f"SGLang {version}'s argparse refuses the {side} command line (adopt names the words)"
            shown = _words(sglang_flags.read_args(version, entry.words))
            return [*out, Difference("argv", "argv", shown, " ".join(rendered), why, False)]
    return [*out, *_option_differences(plan, live, version, entry.words, rendered, namespaces)]


def _prefix_differences(plan: Plan, live: Live, entry: _Entry) -> list[Difference]:
    """Python and how it runs SGLang."""
    out = []
    if live.argv[:1] != plan.argv[:1]:
        shown = live.argv[0] if live.argv else None
        absolute = plan.argv[0] == live.python
        reason = f"{shown} -> {live.python} (a unit needs an absolute path)" if absolute else "another Python"
        out.append(Difference("argv", "python", shown, plan.argv[0], reason, absolute))
    rendered = " ".join(plan.argv[1:3])
    if live.entry == "serve":
        reason = "`sglang serve` runs launch_server's own parser and server for a language model"
        out.append(Difference("argv", "entry", " ".join(entry.head[1:]), rendered, reason, True))
    elif entry.interpreter:
        same = bool(plan.environment.get("PYTHONUNBUFFERED"))
        reason = "python -u: " + (
            "the unit's PYTHONUNBUFFERED does the same" if same else "the unit runs buffered"
        )
        out.append(Difference("argv", "python options", " ".join(entry.interpreter), None, reason, same))
    return out


def _filled(namespace: dict[str, Any], version: str) -> dict[str, Any]:
    """A namespace with SGLang's defaults where the help-derived parser has none."""
    table = sglang_flags.flag_table(version)
    for setting, default in SGLANG_DEFAULTS.items():
        spelled = sglang_flags.flag(setting, version)
        opt = table.option(spelled) if spelled else None
        if opt is not None and namespace.get(opt.dest) is None:
            namespace[opt.dest] = default
    return namespace


def _by_option(version: str, words: list[str]) -> dict[str, list[sglang_flags.ExtraArg]]:
    """Each option's pieces, by its first name, in the order argparse last sets it."""
    out: dict[str, list[sglang_flags.ExtraArg]] = {}
    for arg in sglang_flags.read_args(version, words):
        if arg.option is not None:
            key = arg.option.names[0]
            out[key] = [*out.pop(key, []), arg]
    return out


@dataclass
class _Sides:
    """The live and the rendered options: each option's pieces, and argparse's namespace."""

    live_args: dict[str, list[sglang_flags.ExtraArg]]
    rendered_args: dict[str, list[sglang_flags.ExtraArg]]
    live_ns: dict[str, Any]
    rendered_ns: dict[str, Any]

    def pair(self, live_key: str, rendered_key: str, reason: str) -> Difference:
        """One harmless difference for two options that carry the same setting."""
        ours, theirs = self.live_args.pop(live_key, []), self.rendered_args.pop(rendered_key, [])
        return Difference("argv", live_key, _words(ours), _words(theirs), reason, True)


def _option_differences(
    plan: Plan,
    live: Live,
    version: str,
    words: list[str],
    rendered: list[str],
    namespaces: list[dict[str, Any]],
) -> list[Difference]:
    """One difference per option whose words differ, harmless where both namespaces agree on it."""
    sides = _Sides(_by_option(version, words), _by_option(version, rendered), *namespaces)
    out = [*_api_key_difference(plan, version, sides), *_adaptive_difference(plan, live, version, sides)]
    for key in dict.fromkeys([*sides.rendered_args, *sides.live_args]):
        ours, theirs = sides.live_args.get(key, []), sides.rendered_args.get(key, [])
        opt = (ours or theirs)[-1].option
        assert opt is not None
        same = sides.live_ns.get(opt.dest) == sides.rendered_ns.get(opt.dest)
        reason = _spelling(ours, theirs) if same else _changed(ours, theirs)
        if reason is not None:
            shown = (theirs or ours)[-1].name
            out.append(Difference("argv", shown, _words(ours), _words(theirs), reason, same))
    order = [k for k in sides.live_args if k in sides.rendered_args]
    wanted = [k for k in sides.rendered_args if k in sides.live_args]
    if order != wanted:
        reason = "the same options in another order: argparse reads each alike wherever it stands"
        out.append(Difference("argv", "order", " ".join(order), " ".join(wanted), reason, True))
    return out


def _api_key_difference(plan: Plan, version: str, sides: _Sides) -> list[Difference]:
    """The live --api-key, and the unit's --config file that carries the key instead (CREDENTIAL_ARG)."""
    table = sglang_flags.flag_table(version)
    config, key = table.option(str(sglang_flags.flag("config", version))), table.option("--api-key")
    if config is None or key is None or plan.credential_at is None:
        return []
    if key.names[0] not in sides.live_args or config.names[0] not in sides.rendered_args:
        return []
    if sides.live_ns.get(config.dest) is not None:  # a --config of its own: the namespaces tell
        return []
    sides.rendered_ns[key.dest], sides.rendered_ns[config.dest] = sides.live_ns[key.dest], None
    reason = "--api-key passed in a --config file only the server reads (LoadCredential=)"
    return [sides.pair(key.names[0], config.names[0], reason)]


def _adaptive_difference(plan: Plan, live: Live, version: str, sides: _Sides) -> list[Difference]:
    """The live --speculative-adaptive-config file, and the unit's own copy of the same settings."""
    spelled = sglang_flags.flag("speculative_adaptive_config", version)
    opt = sglang_flags.flag_table(version).option(spelled) if spelled else None
    if opt is None or plan.adaptive_config is None or live.adaptive_config is None:
        return []
    if sides.live_ns.get(opt.dest) is None or not _same_json(plan.adaptive_config, live.adaptive_config):
        return []
    sides.rendered_ns[opt.dest] = sides.live_ns[opt.dest]
    reason = "the unit hands the server its own copy of the same adaptive config (LoadCredential=)"
    return [sides.pair(opt.names[0], opt.names[0], reason)]


def _same_json(one: str, other: str) -> bool:
    try:
        return bool(json.loads(one) == json.loads(other))
    except (ValueError, RecursionError):
        return False


def _words(args: list[sglang_flags.ExtraArg]) -> str | None:
    """The options' words as a line; a secret option's value as SECRET, redacted by the host or not."""
    if not args:
        return None
    secret = {*sglang_flags.SECRET_FLAGS}
    return " ".join(
        f"{arg.name} {SECRET}" if arg.option and secret & {*arg.option.names} else " ".join(arg.words)
        for arg in args
    )


def _values(arg: sglang_flags.ExtraArg) -> list[str]:
    """The words of the option's value: after `=` in the first word, or the words after it."""
    head, eq, rest = arg.words[0].partition("=")
    return [rest, *arg.words[1:]] if eq and head.startswith("--") else list(arg.words[1:])


def _spelling(ours: list[sglang_flags.ExtraArg], theirs: list[sglang_flags.ExtraArg]) -> str | None:
    """Why words argparse reads alike differ, or None where they do not."""
    if not theirs:
        return f"SGLang's default, written out on the live command line ({_words(ours)})"
    if not ours:
        return f"default made explicit ({_words(theirs)})"
    reasons = [f"given {len(ours)} times: argparse keeps the last"] if len(ours) > 1 else []
    mine, rendered = ours[-1], theirs[-1]
    if mine.words != rendered.words:
        if mine.name != rendered.name:
            reasons.append(f"{mine.name} spelled {rendered.name}")
        if _values(mine) != _values(rendered):
            reasons.append(f"{' '.join(_values(mine))} written {' '.join(_values(rendered))}, the same value")
        elif len(mine.words) != len(rendered.words):
            reasons.append(f"{' '.join(mine.words)} written as {' '.join(rendered.words)}")
    return "; ".join(reasons) or None


def _changed(ours: list[sglang_flags.ExtraArg], theirs: list[sglang_flags.ExtraArg]) -> str:
    if not theirs:
        return "only on the live command line: the unit would start without it"
    if not ours:
        return "only on the unit's command line"
    return "SGLang reads another value"


def _env_differences(plan: Plan, live: Live, secret_names: set[str] | None) -> list[Difference]:
    rendered = plan.environment
    out = []
    for name in dict.fromkeys([*live.env, *rendered]):
        ours, theirs = live.env.get(name), rendered.get(name)
        if ours != theirs:
            reason, harmless = _env_judgement(plan, live, name, ours, theirs, secret_names)
            # A secret the host did not redact is still not shown.
            secret = name in (secret_names or ()) or sglang_rules.looks_secret(name)
            shown = SECRET if secret and ours is not None else ours
            out.append(Difference("env", name, shown, theirs, reason, harmless))
    return out


def _env_judgement(
    plan: Plan, live: Live, name: str, ours: str | None, theirs: str | None, secret_names: set[str] | None
) -> tuple[str, bool]:
    """Why a variable differs, and whether the server runs the same."""
    if name.startswith("NCCL_") or name == "CUDA_VISIBLE_DEVICES":
        return ("NCCL reads another setting" if name != "CUDA_VISIBLE_DEVICES" else "other GPUs"), False
    if name in COMPILE_CACHES:
        return "a compile cache (service.compile_cache): only where compiled kernels are kept", True
    if name == "PYTHONUNBUFFERED" and (ours is None or bool(ours) == bool(theirs)):
        # Python reads any value but the empty one as "unbuffered".
        return "the unit sets PYTHONUNBUFFERED, so crash logs reach the journal: output is unbuffered", True
    if theirs is None and ours is not None:
        why = _left_out(live, name, ours)
        if why is not None:
            return f"left out: {why}", True
        held = name in secret_names if secret_names is not None else plan.env_file_path is not None
        if held and (ours == SECRET or sglang_rules.looks_secret(name)):
            return (
                f"a secret: from the unit's EnvironmentFile= {plan.env_file_path}, with the file you create",
                True,
            )
        return "only in the live environment: the unit would start without it", False
    if ours is None:
        return "only in the unit's environment", False
    return "another value", False
