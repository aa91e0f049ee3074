"""Profile -> Plan: the exact argv, environment and unit text a host receives.

Python decides everything here: flag spellings for the SGLang version, quoting, the digest. The
Jinja template only lays the values out. `render` and `deploy` use the same Plan. So what a user
sees on a laptop is byte for byte what the host gets.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import jinja2

from orchestrator.errors import Problem, ProfileError
from orchestrator.paths import TEMPLATES_DIR
from orchestrator.profile import container_rules, sglang_flags, systemd_rules
from orchestrator.profile.model import ADAPTIVE_CREDENTIAL as ADAPTIVE_CREDENTIAL
from orchestrator.profile.model import CACHE_ROOT as CACHE_ROOT
from orchestrator.profile.model import CREDENTIAL as CREDENTIAL
from orchestrator.profile.model import Profile, model_mounts
from orchestrator.profile.model import cache_directory as cache_directory
from orchestrator.profile.model import credentials_dir as credentials_dir
from orchestrator.render import container_unit

UNIT_TEMPLATE = "sglang.service.j2"
MANAGED = "Managed by orchestrator: local edits are overwritten by the next deploy."
#: Root-only directory on hosts for secrets and deploy state.
HOST_STATE_DIR = "/etc/orchestrator"


@dataclass(frozen=True)
class Plan:
    """Everything one host gets for one profile."""

    profile: str
    unit_name: str
    argv: list[str]
    environment: dict[str, str]
    unit: str
    port: int
    #: Host path of the `--config` YAML holding the API key, when the profile has one (root 0600;
    #: systemd hands it to the server with LoadCredential=, whatever service.user is).
    secret_path: str | None = None
    #: Host path of the EnvironmentFile= with secret_env and service.environment_files (0600, owned
    #: by the service user), when the profile has either.
    env_file_path: str | None = None
    #: The user the server runs as (owner of env_file_path).
    user: str = "root"
    #: runtime.kind: host, docker or podman.
    runtime: str = "host"
    #: A container runtime's `run` command up to and including the image, which ExecStart= puts
    #: before `argv`; empty on the host runtime. `environment` is then the container's.
    engine_argv: list[str] = field(default_factory=list)
    #: Where in `argv` the word is that systemd expands at start for the API key's --config file
    #: (CREDENTIAL_ARG), when the profile has an API key. Every word not named here or in
    #: adaptive_at reaches SGLang as written, the same text from a profile included.
    credential_at: int | None = None
    #: Host path of the --speculative-adaptive-config JSON (root 0600; systemd hands it to the
    #: server with LoadCredential=), when speculative.adaptive has tiers; its text is adaptive_config.
    adaptive_path: str | None = None
    adaptive_config: str | None = None
    #: Where in `argv` the word is that systemd expands at start for that file (ADAPTIVE_ARG).
    adaptive_at: int | None = None

    @property
    def digest(self) -> str:
        """Identifies the unit text: equal digests mean nothing to change on the host."""
        return hashlib.sha256(self.unit.encode()).hexdigest()[:16]

    @property
    def exec_argv(self) -> list[str]:
        """ExecStart='s whole command: the engine's `run` and then SGLang's argv, or SGLang's argv."""
        return [*self.engine_argv, *self.argv]

    @property
    def expanded_at(self) -> tuple[int, ...]:
        """Where in `argv` the words are that systemd expands at start (credential_at, adaptive_at)."""
        return tuple(at for at in (self.credential_at, self.adaptive_at) if at is not None)

    def started_argv(self, credentials: str | None = None) -> list[str]:
        """`argv` as SGLang gets it: the credential words as systemd expands them at start, with the
        unit's credentials directory (`credentials`: what the server's $CREDENTIALS_DIRECTORY says)."""
        argv = list(self.argv)
        where = credentials if credentials is not None else credentials_dir(self.unit_name)
        for at in self.expanded_at:
            argv[at] = argv[at].replace(CREDENTIALS_VAR, where, 1)
        return argv

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"argv": self.argv, "environment": self.environment, "unit": self.unit}
        if self.engine_argv:
            out["engine_argv"] = self.engine_argv
        if self.credential_at is not None:
            out["credential_at"] = self.credential_at
        if self.adaptive_at is not None:
            out.update(adaptive_at=self.adaptive_at, adaptive_path=self.adaptive_path)
            out["adaptive_config"] = self.adaptive_config
        return out


# --- argv ---------------------------------------------------------------------------


def build_argv(profile: Profile, node: Node | None = None) -> tuple[list[str], int | None]:
    """SGLang's command line for the profile (for one node of a multi-node server, when given),
    spelled for its SGLang version, and where in it the credential word is (Plan.credential_at;
    the adaptive config's word, when there is one, is the one ADAPTIVE_ARG: adaptive_at)."""
    s = profile.server
    version = s.sglang_version

    def opt(setting: str, value: object = None) -> list[str]:
        name = sglang_flags.flag(setting, version)
        assert name is not None, f"{setting} has no flag in SGLang {version} (validation missed it)"
        if value is None:
            return [name]
        text = _scalar(value)
        # argparse takes a word starting with "-" for an option ("expected one argument"): such a
        # value (a served model name "-x") only reaches SGLang as `--flag=value`.
        return [f"{name}={text}"] if text.startswith("-") else [name, text]

    argv = [s.python, "-m", "sglang.launch_server", *opt("model_path", s.model_path)]
    if s.served_model_name:
        argv += opt("served_model_name", s.served_model_name)
    argv += opt("tp_size", s.tp_size)
    if s.dp_size > 1:
        argv += opt("dp_size", s.dp_size)
    argv += [*opt("host", s.host), *opt("port", s.port)]
    if s.mem_fraction_static is not None:
        argv += opt("mem_fraction_static", s.mem_fraction_static)
    if s.context_length is not None:
        argv += opt("context_length", s.context_length)
    if s.trust_remote_code:
        argv += opt("trust_remote_code")
    if not s.cuda_graph:
        argv += opt("disable_cuda_graph")
    if s.cuda_graph_max_bs is not None:
        argv += opt("cuda_graph_max_bs", s.cuda_graph_max_bs)
    if s.log_level:
        argv += opt("log_level", s.log_level)
    if s.enable_metrics:
        argv += opt("enable_metrics")
    argv += _speculative_argv(profile, opt)
    argv += _disaggregation_argv(profile, opt)
    credential_at = None
    if profile.api_key is not None:
        argv += opt("config", CREDENTIAL_ARG)
        credential_at = len(argv) - 1
    if node is not None:
        argv += node_argv(profile, node)
    return argv + list(s.extra_args), credential_at


def _disaggregation_argv(profile: Profile, opt: Callable[[str, object], list[str]]) -> list[str]:
    """A PD role's flags. The bootstrap port is where a prefill server's bootstrap server listens;
    a decode server takes it for a request whose gateway sent none (SGLang's scheduler)."""
    pd = profile.disaggregation
    if pd is None:
        return []
    argv = opt("disaggregation_mode", pd.mode) + opt("disaggregation_transfer_backend", pd.transfer_backend)
    argv += opt("disaggregation_bootstrap_port", pd.bootstrap_port)
    if pd.ib_device is not None:
        argv += opt("disaggregation_ib_device", pd.ib_device)
    return argv


def _speculative_argv(profile: Profile, opt: Callable[[str, object], list[str]]) -> list[str]:
    spec = profile.speculative
    if spec.algorithm is None:
        return []
    argv = opt("speculative_algorithm", spec.algorithm)
    if spec.draft_model_path:
        argv += opt("speculative_draft_model_path", spec.draft_model_path)
    if spec.adaptive is not None:  # each of the three on its own: SGLang resolves the others
        for setting, value in (
            ("speculative_num_steps", spec.num_steps),
            ("speculative_eagle_topk", spec.eagle_topk),
            ("speculative_num_draft_tokens", spec.num_draft_tokens),
        ):
            if value is not None:
                argv += opt(setting, value)
        argv += opt("speculative_adaptive", None)
        if spec.adaptive.tiers is not None:
            argv += opt("speculative_adaptive_config", ADAPTIVE_ARG)
    elif spec.num_steps is not None:
        argv += opt("speculative_num_steps", spec.num_steps)
        argv += opt("speculative_eagle_topk", spec.eagle_topk)
        argv += opt("speculative_num_draft_tokens", spec.num_draft_tokens)
    return argv


def adaptive_config(profile: Profile) -> str | None:
    """The --speculative-adaptive-config JSON, as SGLang 0.5.23's _load_adaptive_config reads it:
    the knobs at the top level (defaults of every tier), then one key per tier, its smallest batch
    size in digits, with its candidate_steps. None without tiers (SGLang's own default)."""
    adaptive = profile.speculative.adaptive
    if adaptive is None or adaptive.tiers is None:
        return None
    data: dict[str, object] = dict(adaptive.knobs)
    for size, steps in sorted(adaptive.tiers.items()):
        data[str(size)] = {"candidate_steps": list(steps)}
    # One key a line, each tier whole on its line: short enough for the unit's comment to show.
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()) + "\n}\n"


def adaptive_at(argv: list[str]) -> int | None:
    """Where the adaptive config's word is in a built argv: the value after the modelled flag (the
    profile's extra_args, which follow, cannot hold that flag)."""
    for i, word in enumerate(argv[:-1]):
        if word == "--speculative-adaptive-config" and argv[i + 1] == ADAPTIVE_ARG:
            return i + 1
    return None


def _scalar(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


#: How the server finds the API key's --config file (CREDENTIAL, the model's: validation knows
#: where a container mounts it): systemd expands ${CREDENTIALS_DIRECTORY} in ExecStart= to the
#: unit's private credentials directory (/run/credentials/<unit>), readable by service.user
#: only, so a non-root server reads a key its user could never read from /etc/orchestrator.
#: The one ExecStart= word written unescaped, at Plan.credential_at: by its place, never by its
#: text, which a profile may also write (exec_start).
CREDENTIALS_VAR = "${CREDENTIALS_DIRECTORY}"
CREDENTIAL_ARG = f"{CREDENTIALS_VAR}/{CREDENTIAL}"
#: The --speculative-adaptive-config JSON's word in ExecStart=, which systemd expands like
#: CREDENTIAL_ARG (by its place, Plan.adaptive_at).
ADAPTIVE_ARG = f"{CREDENTIALS_VAR}/{ADAPTIVE_CREDENTIAL}"


def secret_path(profile: Profile) -> str:
    stem = PurePosixPath(profile.service.unit_name).stem
    return f"{HOST_STATE_DIR}/{stem}.config.yaml"


def adaptive_path(unit_name: str) -> str:
    """Where the --speculative-adaptive-config JSON of a unit lives on the host."""
    return f"{HOST_STATE_DIR}/{PurePosixPath(unit_name).stem}.tiers.json"


def env_file_path(profile: Profile) -> str | None:
    """The unit's EnvironmentFile= on the host, when it has secret or file-given variables."""
    if not (profile.secret_env or profile.service.environment_files):
        return None
    stem = PurePosixPath(profile.service.unit_name).stem
    return f"{HOST_STATE_DIR}/{stem}.env"


def gpu_set(profile: Profile, nnodes: int = 1) -> list[int]:
    """The nvidia-smi indexes of one host's GPUs: server.gpus, or the first ones (SGLang's GPU 0
    to N-1 without CUDA_VISIBLE_DEVICES; a multi-node rank's share)."""
    s = profile.server
    return list(s.gpus) if s.gpus is not None else list(range(s.gpus_needed // nnodes))


#: Each JIT or compile cache's variable, read where the library reads it, and its folder in the
#: unit's cache directory. SGLang sets DeepGEMM's own DG_JIT_CACHE_DIR from SGLANG_DG_CACHE_DIR
#: (layers/deep_gemm_wrapper), so setting DG_JIT_CACHE_DIR would be overwritten; FlashInfer puts its
#: JIT cache under FLASHINFER_WORKSPACE_BASE/.cache/flashinfer.
COMPILE_CACHES = {
    "TRITON_CACHE_DIR": "triton",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "CUDA_CACHE_PATH": "nv",
}


def build_environment(profile: Profile) -> dict[str, str]:
    """The GPU set, NCCL variables, the compile caches, then the rest; unbuffered Python so crash
    logs reach the journal. A variable of the profile's env wins over any of these.

    In a container the engine hands it the GPUs (numbered from 0 there): no CUDA_VISIBLE_DEVICES.
    """
    env = {}
    if profile.server.gpus is not None and not profile.runtime.container:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, profile.server.gpus))
    env.update(profile.nccl)
    env.setdefault("PYTHONUNBUFFERED", "1")
    cache = cache_directory(profile)
    if cache:
        env.update({name: f"{CACHE_ROOT}/{cache}/{sub}" for name, sub in COMPILE_CACHES.items()})
    env.update(profile.env)
    return env


# --- systemd quoting -----------------------------------------------------------------

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:,+-=@")


#: Characters that change how a terminal shows the unit (`render` prints it): bidi embeddings,
#: overrides and isolates, marks, the BOM, line and paragraph separators. systemd's cunescape()
#: reads `\uXXXX` back to the character.
_INVISIBLE = frozenset("\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff")


def _escape(text: str, *, dollar: bool) -> str:
    """Escape for a double-quoted systemd word: C escapes, `%%` against specifiers, and with
    `dollar` `$$` against ExecStart='s `$` expansion (Environment= has none: `$$` would stay `$$`)."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "%":
            out.append("%%")
        elif ch == "$" and dollar:
            out.append("$$")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif 0x80 <= ord(ch) <= 0x9F or ch in _INVISIBLE:
            out.append(f"\\u{ord(ch):04x}")  # C1 controls (8-bit CSI, OSC) and bidi marks: never raw
        else:
            out.append(ch)
    return "".join(out)


def quote_exec_arg(arg: str) -> str:
    """One ExecStart word that systemd hands to the process unchanged, byte for byte: every `$`
    is `$$`, whatever the word says (`${CREDENTIALS_DIRECTORY}/...` from a profile included).

    Word 0 is an absolute path (validated), so ExecStart's `-@:+!` prefixes never apply.
    """
    if arg and set(arg) <= _SAFE:
        return arg
    return f'"{_escape(arg, dollar=True)}"'


def exec_start(argv: list[str], engine_argv: Sequence[str] = (), expanded: Collection[int] = ()) -> str:
    """ExecStart's value, one flag and its values per line (systemd joins `\\`-ended lines); a
    container engine's `run` first, one option per line and the image on its own. The words at
    `expanded` of `argv` (Plan.expanded_at) alone are written for systemd to expand."""
    lines: list[list[str]] = [[]]
    for i, arg in enumerate(engine_argv):
        if i > 1:
            lines.append([])
        lines[-1].append(quote_exec_arg(arg))
    if engine_argv:
        lines.append([])
    for i, arg in enumerate(argv):
        if arg.startswith("--") and i > 2:
            lines.append([])
        if i in expanded:
            assert arg in (CREDENTIAL_ARG, ADAPTIVE_ARG), f"word {i} is {arg!r}, not a credential"
            lines[-1].append(arg)
        else:
            lines[-1].append(quote_exec_arg(arg))
    return " \\\n    ".join(" ".join(words) for words in lines)


def command_line(words: list[str]) -> str:
    """One Exec*= command on one line (ExecStop=, ExecStartPre=); a leading `-` stays a prefix."""
    return " ".join(quote_exec_arg(word) for word in words)


def unquote_exec(exec_start: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """How systemd turns an ExecStart= value into argv: `_unquote`, then at start `$$` is `$` and
    `${NAME}` is NAME's value (replace_env_argv()), from `environ` when given (an unset one is
    empty); without it such a word stays as written, as Plan.argv spells the credential word.

    The inverse of `exec_start` for what it emits; tests/unit/test_systemd_oracle.py proves both
    against systemd's own reading.
    """

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return match.group(0) if environ is None else environ.get(match.group(1), "")

    return [_REFERENCE.sub(expand, word) for word in _unquote(exec_start)]


#: What replace_env_argv() replaces inside a word: `$$`, and `${NAME}` (plan writes no bare `$NAME`).
_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")


def _unquote(text: str) -> list[str]:
    """The words of a unit value as systemd reads them: continuations, %%, quotes, C escapes."""
    text = text.replace("\\\n", " ")
    text = text.replace("%%", "\0PCT\0")
    words, word, i, quote, have = [], [], 0, None, False
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", " ": " "}
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1]
            if nxt == "x":
                word.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
            elif nxt == "u":
                word.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
            else:
                word.append(escapes[nxt])
                i += 2
            have = True
            continue
        if quote:
            if ch == quote:
                quote = None
            else:
                word.append(ch)
        elif ch in "\"'":
            quote, have = ch, True
        elif ch in " \t":
            if have:
                words.append("".join(word))
            word, have = [], False
        else:
            word.append(ch)
            have = True
        i += 1
    if have:
        words.append("".join(word))
    return [w.replace("\0PCT\0", "%") for w in words]


def environment_line(name: str, value: str) -> str:
    """The value of one `Environment=` assignment, quoted for systemd (which expands no `$` there)."""
    return f'"{_escape(f"{name}={value}", dollar=False)}"'


# --- the unit ------------------------------------------------------------------------


def _comment(text: str) -> str:
    return "\n".join(f"# {line}" if line else "#" for line in text.splitlines())


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["comment"] = _comment
    return env


def _working_directory(path: str) -> str:
    """WorkingDirectory= is read unquoted and unescaped: only specifiers (`%%`) can be escaped.

    Validation refuses what cannot be written there (systemd_rules); this refuses it again, so a
    profile built past validation cannot make a trailing backslash swallow the next unit line.
    """
    problems = systemd_rules.working_directory_problems(path)
    if problems:
        raise ValueError(f"service.working_directory: {problems[0]}")
    return path.replace("%", "%%")


def render_unit(
    profile: Profile,
    argv: list[str],
    environment: dict[str, str],
    engine: container_unit.Service | None = None,
    expanded: Collection[int] = (),
) -> str:
    """The unit text: SGLang's argv on the host, or inside `engine`'s container; the words at
    `expanded` are left for systemd to expand (Plan.expanded_at). The adaptive config's text is in
    a comment, so that the unit's digest changes with it: a new config is a restart, and the
    ledger's unit records it."""
    svc = profile.service
    env_file = env_file_path(profile)
    settings = engine or container_unit.Service()
    credentials = [f"{CREDENTIAL}:{secret_path(profile)}"] if profile.api_key else []
    adaptive = adaptive_config(profile)
    if adaptive is not None:
        credentials.append(f"{ADAPTIVE_CREDENTIAL}:{adaptive_path(svc.unit_name)}")
    return (
        _env()
        .get_template(UNIT_TEMPLATE)
        .render(
            ansible_managed=MANAGED,
            profile=profile.name,
            sglang_version=profile.server.sglang_version,
            sglang_help=sglang_flags.help_version(profile.server.sglang_version),
            runtime=settings.note,
            description=f"SGLang {profile.server.sglang_version} server, profile {profile.name}",
            unit_type=settings.type,
            notify_access=settings.notify_access,
            delegate=settings.delegate,
            user=svc.user,
            working_directory=_working_directory(svc.working_directory),
            # A container gets its environment and secret variables from the engine (--env,
            # --env-file), not from systemd: the engine's CLI needs none of them.
            environment_lines=[] if engine else [environment_line(k, v) for k, v in environment.items()],
            exec_start_pre=[command_line(c) for c in settings.start_pre],
            exec_start=exec_start(argv, settings.run, expanded),
            exec_stop=[command_line(c) for c in settings.stop],
            exec_stop_post=[command_line(c) for c in settings.stop_post],
            start_timeout_s=svc.start_timeout_s,
            stop_timeout_s=svc.stop_timeout_s + settings.stop_margin_s,
            success_exit_status=settings.success_exit_status,
            kill_mode=settings.kill_mode,
            environment_files=[env_file] if env_file and not engine else [],
            credentials=credentials,
            adaptive_path=adaptive_path(svc.unit_name),
            adaptive_config=adaptive or "",
            restart=svc.restart,
            restart_sec=systemd_rules.seconds(svc.restart_sec),
            start_limit_burst=svc.start_limit_burst,
            start_limit_interval_s=svc.start_limit_interval_s,
            limits={"LimitMEMLOCK": svc.limits.memlock, "LimitNOFILE": svc.limits.nofile},
            extra=dict(svc.extra),
            cache_directory=cache_directory(profile),
        )
    )


@dataclass(frozen=True)
class Node:
    """One host's place in a multi-node server."""

    rank: int
    nnodes: int
    dist_init_addr: str  # HOST:PORT of node rank 0


def node_argv(profile: Profile, node: Node) -> list[str]:
    version = profile.server.sglang_version
    return [
        str(sglang_flags.flag("nnodes", version)),
        str(node.nnodes),
        str(sglang_flags.flag("node_rank", version)),
        str(node.rank),
        str(sglang_flags.flag("dist_init_addr", version)),
        node.dist_init_addr,
    ]


def build(profile: Profile, node: Node | None = None) -> Plan:
    """The plan of a validated profile (for one node of a multi-node server, when given)."""
    argv, credential_at = build_argv(profile, node)
    environment = build_environment(profile)
    engine = _engine(profile, environment, node.nnodes if node else 1)
    adaptive, where = adaptive_config(profile), adaptive_at(argv)
    expanded = [at for at in (credential_at, where) if at is not None]
    plan = Plan(
        profile=profile.name,
        unit_name=profile.service.unit_name,
        argv=argv,
        environment=environment,
        unit=render_unit(profile, argv, environment, engine, expanded),
        port=profile.server.port,
        secret_path=secret_path(profile) if profile.api_key else None,
        env_file_path=env_file_path(profile),
        user=profile.service.user,
        runtime=profile.runtime.kind,
        engine_argv=engine.run if engine else [],
        credential_at=credential_at,
        adaptive_path=adaptive_path(profile.service.unit_name) if adaptive else None,
        adaptive_config=adaptive,
        adaptive_at=where,
    )
    problems = size_findings(profile, plan)
    if problems:
        raise ProfileError([Problem(profile.name, loc, message) for loc, message in problems])
    return plan


def size_findings(profile: Profile, plan: Plan) -> list[tuple[str, str]]:
    """What cannot reach the server, located at the profile field that makes it so: an argument
    or environment string over MAX_ARG_STRLEN, a unit line over systemd's LONG_LINE_MAX, argv and
    environment together over what execve() takes. Judged on the plan's own words and unit text,
    so every field that reaches them is covered, with its quoting and escapes."""
    found: list[tuple[list[str], str]] = []  # (the words at fault, problem)
    for word in plan.exec_argv:
        problem = systemd_rules.argument_problem(word, "an argument")
        if problem:
            found.append(([word], problem))
    environ = [f"{name}={value}" for name, value in plan.environment.items()]
    for text in environ:
        problem = systemd_rules.argument_problem(text, "an environment string")
        if problem:
            found.append(([text], problem))
    for first, directive, joined, longest in systemd_rules.unit_lines(plan.unit):
        problem = systemd_rules.line_problem(directive, joined, longest)
        if problem:
            line = plan.unit.split("\n", first)[first - 1]
            named = [e for e in environ if line.startswith(f'Environment="{e.partition("=")[0]}=')]
            found.append((named[:1] or (plan.exec_argv if directive == "ExecStart" else []), problem))
    room = systemd_rules.exec_room(profile.service.extra.get("LimitSTACK"))
    # SGLang's Python, on the host or in the container; and a container engine's CLI.
    for argv, env in [(plan.argv, environ), *([(plan.exec_argv, [])] if plan.engine_argv else [])]:
        problem = systemd_rules.exec_size_problem(argv, env, room)
        if problem:
            found.append(([*argv, *env], problem))
            break
    if not found:
        return []
    values = _values(profile.model_dump())
    return list(dict.fromkeys((_owner(values, words), problem) for words, problem in found))


def _values(data: object, loc: str = "") -> list[tuple[str, str]]:
    """(field, text) of every string in a dumped profile: `env.NAME`, `server.extra_args[2]`."""
    if isinstance(data, dict):
        return [v for key, value in data.items() for v in _values(value, f"{loc}.{key}" if loc else key)]
    if isinstance(data, list):
        return [v for i, value in enumerate(data) for v in _values(value, f"{loc}[{i}]")]
    return [(loc, data)] if isinstance(data, str) and data else []


def _owner(values: list[tuple[str, str]], words: list[str]) -> str:
    """The field whose value is the largest part of `words` ("" for none)."""
    held = [(len(text), loc) for loc, text in values if any(text in word for word in words)]
    return max(held)[1] if held else ""


def _engine(profile: Profile, environment: dict[str, str], nnodes: int) -> container_unit.Service | None:
    """A container runtime's commands. Model and drafter are mounted read-only at their own paths;
    the API key's root-only --config file and the adaptive config read-only where
    ${CREDENTIALS_DIRECTORY} points (the unit still loads the credentials so that systemd expands
    those words, as it does on the host), so the argv inside the container is the host runtime's
    word for word."""
    if not profile.runtime.container:
        return None
    paths: dict[str, str] = {}  # the drafter may be the model, written alike or not (`/m`, `/m/`)
    for _, path in model_mounts(profile):
        paths.setdefault(container_rules.clean_path(path), path)
    mounts = [(path, path, True) for path in paths.values()]
    cache = cache_directory(profile)
    if cache:  # systemd makes it on the host before ExecStart; the container writes to it
        mounts.append((f"{CACHE_ROOT}/{cache}", f"{CACHE_ROOT}/{cache}", False))
    mounts += [(m.source, m.target, m.read_only) for m in profile.runtime.mounts]
    credentials = credentials_dir(profile.service.unit_name)
    if profile.api_key is not None:
        mounts.append((secret_path(profile), f"{credentials}/{CREDENTIAL}", True))
    if adaptive_config(profile) is not None:
        mounts.append(
            (adaptive_path(profile.service.unit_name), f"{credentials}/{ADAPTIVE_CREDENTIAL}", True)
        )
    return container_unit.service(
        profile,
        gpus=gpu_set(profile, nnodes),
        environment=environment,
        mounts=mounts,
        env_file=env_file_path(profile),
    )


def dumps(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2)


def parse_unit(unit: str, environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment a unit text gives SGLang (for comparing deployed units); in a
    container unit, the words after the image and the engine's --env words. `environ`: what
    systemd expands in ExecStart= at start (unquote_exec)."""
    match = re.search(r"^ExecStart=(.*?)(?=\n[^ \n]|\Z)", unit, re.S | re.M)
    argv = unquote_exec(match.group(1), environ) if match else []
    env = {}
    for value in re.findall(r"^Environment=(.*)$", unit, re.M):
        for assignment in _unquote(value):  # Environment= expands no `$`
            name, _, val = assignment.partition("=")
            env[name] = val
    if argv[:1] and argv[0] in container_unit.ENGINES.values():
        # Every engine option is one word: the image is the first word after `run` without a '-'.
        image = next(i for i, word in enumerate(argv) if i > 1 and not word.startswith("-"))
        for word in argv[2:image]:
            if word.startswith("--env="):
                name, _, val = word.removeprefix("--env=").partition("=")
                env[name] = val
        argv = argv[image + 1 :]
    return argv, env


def flags_of(argv: list[str]) -> dict[str, str]:
    """`--flag value...` groups of an SGLang argv (after `-m sglang.launch_server`)."""
    flags: dict[str, list[str]] = {}
    current = None
    for arg in argv[3:]:
        if arg.startswith("--"):
            current = arg.split("=", 1)[0]
            flags[current] = [arg.split("=", 1)[1]] if "=" in arg else []
        elif current is not None:
            flags[current].append(arg)
    return {k: " ".join(v) if v else "(set)" for k, v in flags.items()}


def adaptive_settings(unit: str) -> dict[str, str]:
    """The adaptive config a unit text shows in its comment (render_unit): each key's JSON."""
    match = re.search(r"^# speculative adaptive config, [^\n]*:\n((?:# [^\n]*\n)+)", unit, re.M)
    if not match:
        return {}
    data = json.loads("".join(line[2:] + "\n" for line in match.group(1).splitlines()))
    return {key: json.dumps(value) for key, value in data.items()}


def flag_changes(old_unit: str, new_unit: str) -> list[str]:
    """Which SGLang flags, environment variables and adaptive settings change, from what to what."""
    old_argv, old_env = parse_unit(old_unit)
    new_argv, new_env = parse_unit(new_unit)
    lines = []
    for label, old, new in (
        ("", flags_of(old_argv), flags_of(new_argv)),
        ("env ", old_env, new_env),
        ("adaptive ", adaptive_settings(old_unit), adaptive_settings(new_unit)),
    ):
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in new:
                lines.append(f"{label}{key}: {old[key]} -> (removed)")
            elif key not in old:
                lines.append(f"{label}{key}: (unset) -> {new[key]}")
            elif old[key] != new[key]:
                lines.append(f"{label}{key}: {old[key]} -> {new[key]}")
    if old_argv[:1] != new_argv[:1]:
        lines.insert(0, f"python: {' '.join(old_argv[:1]) or '(none)'} -> {' '.join(new_argv[:1])}")
    return lines
