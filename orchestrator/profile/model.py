"""The Profile model: one named SGLang deployment, validated before anything touches a host.

Profiles are YAML files, one per name, in the profiles folder. That is `--profiles-dir`, else
`$ORCHESTRATOR_PROFILES`, else `./profiles/`. The examples shipped with the tool are `example:NAME`.
A variant says `extends: base` and states only what differs. Mappings merge key by key. Anything
else replaces.

Validation collects every problem at once: a profile with five mistakes reports five lines. Each is
`file: field.path: message`, with the fix in the message. A mistake must cost a second on the
control machine, not a five-minute model load.
"""

from __future__ import annotations

import codecs
import difflib
import errno
import ipaddress
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from orchestrator.errors import InputError, Problem, ProfileError
from orchestrator.paths import EXAMPLES_DIR
from orchestrator.profile import container_rules, sglang_flags, sglang_rules, systemd_rules, yaml12

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_RULE = "letters, digits, '_', '-' and '.', starting with a letter or digit"

#: Limits on a profile file as if its aliases were expanded. No real profile comes near them;
#: a few lines of `&a [*a, *a]` stand for 10**9 values (or for themselves: `&a [*a]`), and
#: pydantic, `merge` and the error messages would each walk every one of them.
MAX_VALUES = 10_000
MAX_DEPTH = 32

#: Upper bound of counts and timeouts: a C int, which systemd, argparse and CUDA all take,
#: so 10**30 is refused here rather than by systemd-analyze on the host.
INT_MAX = 2**31 - 1


def _one_reading(value: Any) -> Any:
    """A number written so that YAML 1.1 (Ansible, PyYAML) reads another one is refused, naming
    both: `port: 075` is 75 here and 61 there; `12:30` is text here and 750 there."""
    problem = yaml12.two_readings(value)
    if problem:
        raise ValueError(problem)
    return value


#: Counts, ports and timeouts take integers only. Pydantic's lax mode would read the YAML
#: boolean in `tp_size: true` as 1 (rendered `--tp-size 1`), and "8" or 8.0 as 8.
Int = Annotated[int, Strict(), BeforeValidator(_one_reading)]
#: Fractions and intervals take ints and floats, never a boolean (`true` would be 1.0).
Number = Annotated[float, Strict(), BeforeValidator(_one_reading)]


class _Model(BaseModel):
    """A section of a profile. A number given to a text field is its text as written (yaml12):
    `env: {A: 1.10}` is "1.10", `UMask: 0777` is "0777"."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def _env_scalar(value: Any) -> Any:
    """Environment values are strings: a number is its text as written (yaml12), a boolean is
    ambiguous (`true`, `1` or `True`?)."""
    if isinstance(value, bool):
        raise ValueError("use a quoted string such as '1' or '0', not a YAML boolean")
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _argparse_value(value: str) -> str:
    """SGLang's argparse drops a value that is exactly `--` (Python's argparse strips it), so
    the server would get none."""
    if value == "--":
        raise ValueError("'--' cannot reach SGLang (its argparse drops it); choose another value")
    return value


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_NUMERIC_LABEL = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


def _bind_address(value: str) -> str:
    """server.host reaches SGLang's --host and the health URL (http://HOST:PORT/health): an IP
    address as written canonically, or a host name of RFC 1123 labels. A numeric form that
    inet_aton() reads as another address (`127.1`, `0x7f000001`) is refused, as is an IPv6 zone."""
    try:
        ipaddress.ip_address(value)
        if "%" not in value:
            return value
    except ValueError:
        pass
    labels = value.split(".")
    if all(_NUMERIC_LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            f"{_short(value)} is not an IP address as written: give four decimal numbers such as 127.0.0.1"
        )
    if len(value) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            f"{_short(value)} is neither an IP address (no brackets, no zone) nor a host name: "
            "give e.g. 127.0.0.1, 0.0.0.0, ::1 or gpu1.example.com"
        )
    return value


def _model_name(value: str) -> str:
    """An empty name would be dropped from the command line, and the API would report the path."""
    if not value:
        raise ValueError(
            "is empty: give the name the OpenAI API should report, or drop the key (the "
            "model path is the default name)"
        )
    return _argparse_value(value)


def _profile_name(value: str) -> str:
    """The name reaches file names and the unit on every host: no paths, no spaces, no surprises."""
    if not NAME_RE.fullmatch(value):
        raise ValueError(
            f"{_short(value)} is not a profile name: use {NAME_RULE} (set `name:` or rename the file)"
        )
    return value


def _sglang_version(value: str) -> str:
    problem = sglang_flags.version_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _systemd(check: Callable[[str], list[str]]) -> AfterValidator:
    """A systemd_rules check as a field validator: what systemd would refuse or change is an error here."""

    def validate(value: str) -> str:
        problems = check(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    return AfterValidator(validate)


def _env_name(name: str) -> str:
    """A variable's name in env or secret_env, both of which reach the server's environment (an
    Environment= line, or a line of its EnvironmentFile= or the engine's --env-file, where a newline
    in the name would start another variable): one systemd takes, and not one it sets itself for
    the unit to rely on."""
    problem = systemd_rules.env_name_problem(name) or systemd_rules.service_manager_env_problem(name)
    if problem:
        raise ValueError(problem)
    return name


#: The longest file name a host derives from service.unit_name is its facts file's temporary copy,
#: `.<unit>.json.XXXXXXXX` (module_utils write_atomic): 15 bytes more than the name itself, within
#: NAME_MAX. The others are shorter: <stem>.config.yaml, <stem>.env and <stem>.tiers.json beside it
#: (and their temporary copies), the unit file, /run/credentials/<unit>, the lock <unit>.lock, the
#: container named <stem>.
UNIT_NAME_LIMIT = systemd_rules.NAME_MAX - len("..json.XXXXXXXX")


def _unit_name(name: str) -> str:
    """A plain service unit's name, as systemd takes it and the host's files named after it can hold it.

    systemd takes `.sglang.service`, but the host's listing of its orchestrator units skips names
    starting with '.' (module_utils deployed_units: they are write_atomic's temporary files), so
    such a unit's facts would never be seen: its port, GPUs and neighbours unchecked."""
    problems = systemd_rules.unit_name_problems(name)
    if name.startswith("."):
        problems.append(
            f"{_short(name)} starts with '.', which the host takes for a temporary file of its own "
            "(its facts would be skipped); remove the dot"
        )
    if not problems and len(name) > UNIT_NAME_LIMIT:
        problems = [
            f"is {len(name)} characters long: a file the host names after it (.<unit>.json.XXXXXXXX) "
            f"would exceed {systemd_rules.NAME_MAX} bytes; use at most {UNIT_NAME_LIMIT}"
        ]
    if problems:
        raise ValueError("; ".join(problems))
    return name


def _gpu_set(value: Any) -> Any:
    """`[4, 5, 6, 7]`, `"4-7"` or `"0-1,6,7"` as a list of nvidia-smi indexes, in the given order
    (CUDA_VISIBLE_DEVICES's order is the server's GPU 0, 1, ...)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, str):
        return value
    out: list[int] = []
    for part in value.split(","):
        low, dash, high = (side.strip() for side in part.partition("-"))
        part = part.strip()  # spaces around a number only: '1 2' is not GPU 12
        if not _gpu_index(low) or (dash and not _gpu_index(high)):
            raise ValueError(f"{_short(value)} is not a GPU list: write [4, 5, 6, 7], '4-7' or '0-1,6,7'")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"{part!r} counts down: write {last}-{first}")
        if last > MAX_GPU:  # before the range is expanded: '0-999999999999' is a MemoryError
            raise ValueError(
                f"{_short(part)} goes past GPU {MAX_GPU}: nvidia-smi numbers a host's GPUs from 0"
            )
        out += range(first, last + 1)
        if len(out) > MAX_GPU + 1:
            raise ValueError(f"{_short(value)} lists over {MAX_GPU + 1} GPUs; no host has that many")
    return out


def _gpu_index(text: str) -> bool:
    """ASCII digits (str.isdigit() also takes '٤' and '²'), short enough to read at once."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _distinct(gpus: list[int]) -> list[int]:
    dupes = sorted({g for g in gpus if gpus.count(g) > 1})
    if dupes:
        raise ValueError(f"GPU {dupes[0]} is listed twice")
    return gpus


#: The highest nvidia-smi index a profile may name (a host has at most a few dozen GPUs).
MAX_GPU = 63
GpuIndex = Annotated[int, Strict(), BeforeValidator(_one_reading), Field(ge=0, le=MAX_GPU)]
GpuSet = Annotated[list[GpuIndex], BeforeValidator(_gpu_set), AfterValidator(_distinct), Field(min_length=1)]


def _restart(value: Any) -> Any:
    """YAML 1.1 reads a bare `no` as false: that is the policy `no`, not a boolean."""
    return "no" if value is False else value


def _limit(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _checked_limit(directive: str) -> AfterValidator:
    """A service.limits value as systemd's config_parse_rlimit() reads it for `directive`."""

    def validate(value: str) -> str:
        problem = systemd_rules.limit_problem(directive, value)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(validate)


def _seconds(value: float) -> float:
    problem = systemd_rules.seconds_problem(value)
    if problem:
        raise ValueError(problem)
    return value


SizeLimit = Annotated[str, BeforeValidator(_limit), _checked_limit("LimitMEMLOCK")]
CountLimit = Annotated[str, BeforeValidator(_limit), _checked_limit("LimitNOFILE")]

EnvValue = Annotated[str, BeforeValidator(_env_scalar)]
EnvName = Annotated[str, AfterValidator(_env_name)]
AbsPath = Annotated[str, Field(pattern=r"^/[^\x00-\x1f]*$", description="An absolute path on the host.")]


class Server(_Model):
    """How SGLang itself is started."""

    sglang_version: Annotated[str, AfterValidator(_sglang_version)] = Field(
        "0.5.9",
        description="SGLang version installed on the hosts: any release from 0.5.9 on (0.5.10.post1 too); "
        "flags are rendered from the nearest shipped --help at or below it.",
    )
    python: Annotated[AbsPath, _systemd(systemd_rules.executable_problems)] = Field(
        "/usr/bin/python3",
        description="Python executable that has SGLang installed: on the host, or inside runtime.image "
        "with a container runtime (the argv is the same words either way).",
    )
    model_path: AbsPath = Field(description="Target model directory on the host.")
    served_model_name: Annotated[str, AfterValidator(_model_name)] | None = Field(
        None, description="Name the OpenAI API reports for the model."
    )
    tp_size: Int = Field(1, ge=1, le=64, description="Tensor parallel size (GPUs per replica).")
    dp_size: Int = Field(
        1,
        ge=1,
        le=64,
        description="Data parallel size: replicas inside one server, or attention groups "
        "sharing the tp_size GPUs with --enable-dp-attention in extra_args.",
    )
    host: Annotated[str, AfterValidator(_bind_address)] = Field(
        "127.0.0.1",
        description="Address the HTTP server binds: an IP address (:: or 0.0.0.0 for all) or a host name.",
    )
    port: Int = Field(30000, ge=1, le=65535, description="HTTP port of the server.")
    mem_fraction_static: Number | None = Field(
        None, gt=0, lt=1, description="Fraction of GPU memory for weights and KV cache, in (0, 1)."
    )
    context_length: Int | None = Field(
        None, ge=1, le=INT_MAX, description="Maximum context length; model default if unset."
    )
    trust_remote_code: bool = Field(False, description="Allow the model's own modelling code.")
    cuda_graph: bool = Field(True, description="Capture CUDA graphs (off renders --disable-cuda-graph).")
    cuda_graph_max_bs: Int | None = Field(
        None, ge=1, le=INT_MAX, description="Largest batch size captured in CUDA graphs."
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] | None = Field(
        None, description="SGLang's log level."
    )
    enable_metrics: bool = Field(False, description="Serve Prometheus metrics on /metrics.")
    extra_args: list[str] = Field(
        default_factory=list, description="Further SGLang flags, verbatim; must not repeat a modelled one."
    )
    gpus: GpuSet | None = Field(
        None,
        description="nvidia-smi indexes of the GPUs this server uses on each host ([4, 5, 6, 7] or '4-7'): "
        "rendered as CUDA_VISIBLE_DEVICES, and the only GPUs preflight, the idle check, "
        "--kill-gpu-holders, status and verify look at. Unset: GPUs 0 to TP x DP - 1.",
    )

    @property
    def gpus_needed(self) -> int:
        """GPUs this server uses over all its nodes, as SGLang counts them: tp x pp per replica,
        dp_size replicas, or one TP group when --enable-dp-attention shares it (rules.gpus_needed)."""
        return sglang_rules.gpus_needed(
            sglang_version=self.sglang_version,
            tp_size=self.tp_size,
            dp_size=self.dp_size,
            extra_args=self.extra_args,
        )


#: Bounds of speculative.adaptive.tiers. SGLang captures CUDA graphs for every step of every tier at
#: start, so each tier and step costs start-up time and GPU memory; no useful config comes near these.
MAX_ADAPTIVE_TIERS = 16
MAX_ADAPTIVE_STEPS = 32


def _adaptive_on(value: Any) -> Any:
    """`adaptive: true` could mean SGLang's default tiers or a mistake for a mapping; `{}` says it."""
    if isinstance(value, bool):
        fix = "write adaptive: {} for SGLang's default tiers" if value else "drop adaptive to turn it off"
        raise ValueError(f"is a mapping, not a boolean: {fix}")
    return value


def _tier_number(value: Any, what: str) -> int | None:
    """`value` as an integer a tier may hold, or None when it is none (a boolean, text, a float)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    problem = yaml12.two_readings(value)
    if problem:
        raise ValueError(f"{what}: {problem}")
    return int(value)


def _adaptive_tiers(value: Any) -> Any:
    """Batch size -> draft steps, each as SGLang's loader takes it (adaptive_spec_params
    _load_adaptive_config): keys are batch sizes >= 1, each list non-empty ints >= 0. Ascending, so
    that no reader takes another "middle" step to start from."""
    if not isinstance(value, dict) or not value:
        raise ValueError(
            "give a mapping of batch size to draft steps, such as {1: [1, 3, 5, 7], 8: [0, 1, 3]}; "
            "drop tiers for SGLang's default"
        )
    if len(value) > MAX_ADAPTIVE_TIERS:
        raise ValueError(f"has {len(value)} tiers; give at most {MAX_ADAPTIVE_TIERS}")
    for key, steps in value.items():
        size = _tier_number(key, f"tier {_short(key)}")
        if size is None or not 1 <= size <= INT_MAX:
            raise ValueError(
                f"tier {_short(key)} is not a batch size: write an integer >= 1, such as 8 (the smallest "
                "batch size the tier serves)"
            )
        if not isinstance(steps, list) or not steps or len(steps) > MAX_ADAPTIVE_STEPS + 1:
            raise ValueError(f"tier {size}: give a list of draft steps, such as [0, 1, 3]")
        numbers = [_tier_number(step, f"tier {size}") for step in steps]
        counts = [n for n in numbers if n is not None and 0 <= n <= MAX_ADAPTIVE_STEPS]
        if len(counts) < len(numbers):
            raise ValueError(
                f"tier {size}: {_short(steps)} holds a value that is no draft step count: give integers "
                f"from 0 (no drafting) to {MAX_ADAPTIVE_STEPS}"
            )
        if counts != sorted(set(counts)):
            raise ValueError(f"tier {size}: list each step once, in ascending order: {sorted(set(counts))}")
    return value


class Adaptive(_Model):
    """SGLang 0.5.23's adaptive speculative decoding (--speculative-adaptive): the draft steps
    follow acceptance, per batch-size range. `{}` runs SGLang's default tiers; with `tiers` the
    profile's own config is written to the host (--speculative-adaptive-config)."""

    tiers: Annotated[dict[int, list[int]], BeforeValidator(_adaptive_tiers)] | None = Field(
        None,
        description="Batch size -> candidate draft steps, e.g. {1: [1, 3, 5, 7], 8: [0, 1, 3]}: a tier "
        "serves batches from its size up to the next tier's; 0 steps is no drafting. Unset: SGLang's "
        "default {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}.",
    )
    ema_alpha: Number | None = Field(
        None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Weight of the newest batch in the EMA (SGLang: 0.2).",
    )
    update_interval: Int | None = Field(
        None, ge=1, le=INT_MAX, description="Verify batches between two decisions (SGLang: 5)."
    )
    warmup_batches: Int | None = Field(
        None, ge=0, le=INT_MAX, description="Verify batches of a tier before its first decision (SGLang: 10)."
    )
    down_hysteresis: Number | None = Field(
        None,
        ge=-32,
        le=32,
        allow_inf_nan=False,
        description="Added to the threshold to step down (SGLang: -0.25).",
    )
    up_hysteresis: Number | None = Field(
        None,
        ge=-32,
        le=32,
        allow_inf_nan=False,
        description="Added to the threshold to step up (SGLang: 0.0).",
    )
    ceiling_coeff: Number | None = Field(
        None,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        description="Caps steps at max(1, ceil(EMA x this)) when stepping down; 0 is off (SGLang: 0).",
    )

    @property
    def knobs(self) -> dict[str, float | int]:
        """The settings given besides the tiers, by SGLang's key names."""
        return {k: v for k, v in self.model_dump(exclude={"tiers"}).items() if v is not None}


class Speculative(_Model):
    """Speculative decoding: all of steps/topk/draft_tokens, or none to let SGLang choose (with
    adaptive, each may be left out)."""

    algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] | None = Field(
        None, description="Speculative algorithm; EAGLE3 for EAGLE-3 drafters."
    )
    draft_model_path: AbsPath | None = Field(None, description="Draft model directory on the host.")
    num_steps: Int | None = Field(None, ge=1, le=32, description="Draft steps per verify.")
    eagle_topk: Int | None = Field(None, ge=1, le=64, description="Branching factor of the draft tree.")
    num_draft_tokens: Int | None = Field(None, ge=1, le=256, description="Tokens verified per step.")
    adaptive: Annotated[Adaptive, BeforeValidator(_adaptive_on)] | None = Field(
        None,
        description="Adaptive draft steps (SGLang 0.5.23, EAGLE/EAGLE3/NEXTN, top-k 1): {} for SGLang's "
        "default tiers, or tiers and knobs of your own; unset: off.",
    )


class Limits(_Model):
    """Resource limits of the server process (systemd Limit*=)."""

    memlock: SizeLimit = Field(
        "infinity",
        description="LimitMEMLOCK=: NCCL over InfiniBand/RoCE registers memory; the default 8 MiB fails.",
    )
    nofile: CountLimit = Field(
        "1048576", description="LimitNOFILE=: open files (sockets of many clients), a count without suffix."
    )


class Service(_Model):
    """The systemd unit and how long each phase may take."""

    unit_name: Annotated[str, AfterValidator(_unit_name)] = Field(
        "sglang.service",
        description="Name of the systemd unit, ending in .service: ASCII letters, digits, '-', '_' and '.', "
        f"not starting with '.', at most {UNIT_NAME_LIMIT} characters.",
    )
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]*$")] = Field(
        "root", description="User the server runs as."
    )
    working_directory: Annotated[AbsPath, _systemd(systemd_rules.working_directory_problems)] = Field(
        "/", description="Working directory of the server."
    )
    start_timeout_s: Int = Field(900, ge=1, le=INT_MAX, description="systemd TimeoutStartSec.")
    stop_timeout_s: Int = Field(
        60, ge=1, le=INT_MAX, description="systemd TimeoutStopSec: SIGTERM, then SIGKILL."
    )
    health_timeout_s: Int = Field(
        1800, ge=1, le=INT_MAX, description="How long a deploy waits for /health to answer 200."
    )
    health_poll_interval_s: Number = Field(
        0.25, ge=0.01, le=1.0, description="Seconds between health polls, from 0.01 to 1."
    )
    compile_cache: bool = Field(
        True,
        description="Keep the JIT and compile caches (Triton, DeepGEMM, TorchInductor, FlashInfer, CUDA) "
        "across restarts in /var/cache/orchestrator/<unit name>, made by systemd (CacheDirectory=) and "
        "owned by service.user, mounted into a container at the same path; false: each library's default "
        "(the service user's home, or /tmp), which a container's --rm throws away at every restart.",
    )
    stall_factor: Number = Field(
        3,
        ge=1,
        le=1000,
        description="A start-up phase with no new log line for this many times its usual length (the "
        "median of the last 5 healthy starts of this model on the host) fails as stalled.",
    )
    stall_floor_s: Int = Field(
        120,
        ge=1,
        le=INT_MAX,
        description="The least stall limit of any phase, in seconds; also distributed init's when the "
        "host has no history (a phase without history has no limit but health_timeout_s).",
    )
    restart: Annotated[Literal["no", "on-failure"], BeforeValidator(_restart)] = Field(
        "no",
        description="systemd Restart=: no, or on-failure to bring a crashed server back (a deploy "
        "still fails when the server dies while it waits for health).",
    )
    restart_sec: Annotated[Number, AfterValidator(_seconds)] = Field(
        10, ge=0, le=3600, description="systemd RestartSec= (on-failure), in whole microseconds at most."
    )
    start_limit_burst: Int = Field(
        3, ge=1, le=1000, description="Restarts within start_limit_interval_s before systemd gives up."
    )
    start_limit_interval_s: Int = Field(
        3600, ge=1, le=INT_MAX, description="systemd StartLimitIntervalSec= (on-failure)."
    )
    limits: Limits = Field(default_factory=lambda: Limits(), description="Resource limits of the server.")
    environment_files: list[str] = Field(
        default_factory=list,
        description="Files on the control machine in systemd's NAME=value form (not readable by other "
        "users); their variables reach the server through a 0600 file owned by service.user on the "
        "host, read with EnvironmentFile=, never inline in the unit.",
    )
    extra: dict[str, Annotated[str, BeforeValidator(_limit)]] = Field(
        default_factory=dict,
        description="Further [Service] directives from an allow-list (CPUAffinity, Nice, NUMAPolicy, ...), "
        "values checked.",
    )

    @model_validator(mode="after")
    def _extra_directives(self) -> Service:
        problems = [
            f"{name}: {problem}"
            for name, value in self.extra.items()
            if (problem := systemd_rules.extra_problem(name, value))
        ]
        if not problems:
            problems = systemd_rules.extra_combination_problems(dict(self.extra))
        if problems:
            raise ValueError("extra: " + "; ".join(problems))
        return self


class ApiKey(_Model):
    """A secret given by reference on the control machine, never inline (api_key, secret_env)."""

    file: str | None = Field(None, description="File on the control machine holding the key.")
    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = Field(
        None, description="Environment variable on the control machine holding the key."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ApiKey:
        if (self.file is None) == (self.env is None):
            raise ValueError("give exactly one of `file` or `env`")
        return self


class Deployment(_Model):
    """How the hosts a deploy selects serve: each its own server, or one server spread over all.

    An inventory group can say the same with the variable `orchestrator_deployment: multinode`.
    """

    kind: Literal["fleet", "multinode"] = Field(
        "fleet",
        description="fleet: every host runs its own replica; multinode: one SGLang server over all "
        "selected hosts (--nnodes from their count, --node-rank from their order).",
    )
    dist_init_port: Int = Field(
        5757, ge=1, le=65535, description="Port on node rank 0 for --dist-init-addr (multinode)."
    )


#: SGLang's --disaggregation-transfer-backend choices, all versions together (a version's own
#: help says which it has: sglang_rules.check_disaggregation).
TransferBackend = Literal["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]


class Disaggregation(_Model):
    """This server's role in a prefill/decode disaggregated fleet (docs/pd.md).

    The inventory groups `prefill` and `decode` say which hosts serve each role.
    """

    mode: Literal["prefill", "decode"] = Field(
        description="prefill: computes each prompt's KV cache; decode: receives it and generates."
    )
    transfer_backend: TransferBackend = Field(
        "mooncake", description="How the KV cache moves from prefill to decode (SGLang's default: mooncake)."
    )
    bootstrap_port: Int = Field(
        8998,
        ge=1,
        le=65535,
        description="The prefill server's bootstrap port, where decode servers find its KV "
        "(the same on both roles).",
    )
    ib_device: Annotated[str, AfterValidator(_argparse_value)] | None = Field(
        None, description="InfiniBand device(s) for the transfer, e.g. mlx5_0 or mlx5_0,mlx5_1."
    )


def _checked(check: Callable[[str], str | None]) -> AfterValidator:
    """A container_rules check as a field validator."""

    def validate(value: str) -> str:
        problem = check(value)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(validate)


def _run_option(option: str) -> str:
    """One runtime.options entry, checked and written as the one word `--name=value`."""
    name, value = container_rules.run_option(option)
    return name if value is None else f"{name}={value}"


MountPath = Annotated[AbsPath, _checked(container_rules.mount_path_problem)]
MountSource = Annotated[AbsPath, _checked(container_rules.mount_source_problem)]


class Mount(_Model):
    """A host path the container sees (`--volume SOURCE:TARGET[:ro]`)."""

    source: MountSource = Field(description="Absolute path on the host (no ':' or ',', not under /dev).")
    target: MountPath = Field(description="Absolute path inside the container (no ':' or ',').")
    read_only: bool = Field(
        True, description="Mount it read-only (the default); false for a directory the server writes."
    )


class Runtime(_Model):
    """Where SGLang runs: a Python on the host, or a container of docker or podman on the host.

    In a container, the server's argv is the host runtime's, word for word (server.python is the
    image's); systemd supervises the engine's `run` command (podman's own systemd integration, or
    a foreground `docker run`), on the host network, with the GPUs of server.gpus, model and
    drafter mounted read-only at their own paths.
    """

    kind: Literal["host", "docker", "podman"] = Field(
        "host",
        description="host: systemd starts server.python on the host; docker or podman: inside "
        "runtime.image, with that engine.",
    )
    image: Annotated[str, _checked(container_rules.image_problem)] | None = Field(
        None,
        description="The image, as a full reference with its registry: REGISTRY/PATH:TAG@sha256:DIGEST "
        f"(e.g. {container_rules.EXAMPLE_IMAGE}); a tag without a digest is warned about. docker and "
        "podman only.",
    )
    pull: Literal["never", "missing", "always"] = Field(
        "missing",
        description="When the engine pulls the image at start: never, missing (when absent) or always.",
    )
    shm_size: Annotated[str, _checked(container_rules.shm_size_problem)] | None = Field(
        None,
        description="Size of the container's private /dev/shm, e.g. 32g (needs ipc_host: false).",
    )
    mounts: list[Mount] = Field(
        default_factory=list,
        description="Further host paths the container sees, [{source, target, read_only}]; "
        "server.model_path and speculative.draft_model_path are mounted read-only at their own "
        "paths without being listed.",
    )
    ipc_host: bool = Field(
        True,
        description="Share the host's IPC namespace and /dev/shm (--ipc host), as SGLang's own docker "
        "instructions do; false for a private /dev/shm of shm_size.",
    )
    cgroups: Literal["split", "disabled"] = Field(
        "split",
        description="podman only: split (the default) puts conmon and the container in sub-cgroups of "
        "the unit's own (Delegate=yes); disabled creates none, so both stay in the unit's cgroup, for "
        "hosts where podman may not write cgroups (a systemd-nspawn host with cgroup v1 read-only, "
        "as the lab's). Either way systemd's stop and the GPU check see the container in the unit.",
    )
    gpu_devices: Literal["gpus", "cdi"] | None = Field(
        None,
        description="How the GPUs of server.gpus reach the container: gpus, docker's --gpus (NVIDIA's "
        "runtime hook: the NVIDIA Container Toolkit on the host), or cdi, one --device "
        "nvidia.com/gpu=N each from the host's CDI spec (`nvidia-ctk cdi generate`; docker 25 or "
        "later with its cdi feature on). Default: gpus for docker; podman takes CDI devices only.",
    )
    options: list[Annotated[str, AfterValidator(_run_option)]] = Field(
        default_factory=list,
        description="Further `run` options from an allow-list, values checked: --cap-add, "
        "--security-opt, --pids-limit, --ulimit (not memlock or nofile: service.limits), --device, "
        "--init; each '--name=value' (or '--name value').",
    )

    @property
    def container(self) -> bool:
        return self.kind != "host"

    @property
    def gpu_request(self) -> Literal["gpus", "cdi"]:
        """How the unit asks the engine for GPUs: gpu_devices, else the engine's own way."""
        return self.gpu_devices or ("gpus" if self.kind == "docker" else "cdi")


class Profile(_Model):
    """One named SGLang deployment."""

    name: Annotated[str, AfterValidator(_profile_name)] = Field(description="Profile name (the file's stem).")
    description: str = Field("", description="What this profile is for; record measured speeds here.")
    extends: str | None = Field(None, description="Profile this one is based on.")
    server: Server
    speculative: Speculative = Field(default_factory=Speculative)
    nccl: dict[str, EnvValue] = Field(default_factory=dict, description="NCCL_* environment variables.")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Other environment variables of the server."
    )
    service: Service = Field(default_factory=Service)
    api_key: ApiKey | None = Field(None, description="API key by reference: {file: PATH} or {env: NAME}.")
    secret_env: dict[EnvName, ApiKey] = Field(
        default_factory=dict,
        description="Secret environment variables (HF_TOKEN) by reference, {file: PATH} or {env: NAME}: "
        "read on the control machine, written 0600 for service.user on the host, never in the unit.",
    )
    deployment: Deployment = Field(default_factory=lambda: Deployment())
    disaggregation: Disaggregation | None = Field(
        None, description="Prefill/decode disaggregation: this server's role, and how KV moves (docs/pd.md)."
    )
    runtime: Runtime = Field(
        default_factory=lambda: Runtime(),
        description="Where SGLang runs: on the host (the default), or in a docker or podman container.",
    )


# --- Loading ------------------------------------------------------------------------


#: `example:NAME` names a profile shipped with the tool, wherever it is installed.
EXAMPLE = "example:"
PATH_RULE = (
    "a value with '/' or ending in .yml is a file path, example:NAME a shipped example, and a bare "
    "name is looked up in the profiles folder: --profiles-dir, else $ORCHESTRATOR_PROFILES, else ./profiles/"
)

_profiles_dir_option: Path | None = None


def use_profiles_dir(path: Path | None) -> None:
    """`--profiles-dir`: where bare names are looked up, before `$ORCHESTRATOR_PROFILES`."""
    global _profiles_dir_option
    _profiles_dir_option = path


def profiles_dir() -> tuple[Path, str]:
    """The folder bare profile names are looked up in, and how a message names it: `--profiles-dir`,
    else `$ORCHESTRATOR_PROFILES`, else ./profiles/ (which need not exist: the examples still do)."""
    if _profiles_dir_option is not None:
        return _profiles_dir_option, f"{_profiles_dir_option} (--profiles-dir)"
    if os.environ.get("ORCHESTRATOR_PROFILES"):
        folder = Path(os.environ["ORCHESTRATOR_PROFILES"])
        return folder, f"{folder} ($ORCHESTRATOR_PROFILES)"
    return Path("profiles"), "./profiles/"


def available() -> dict[str, Path]:
    """The profiles folder's profiles: name (what `-p NAME` takes) -> file."""
    return {p.stem: p for p in sorted(profiles_dir()[0].glob("*.yml"))}


def examples() -> dict[str, Path]:
    """The example profiles shipped with the tool: name (`example:NAME`) -> file."""
    return {p.stem: p for p in sorted(EXAMPLES_DIR.glob("*.yml"))}


def is_example(path: Path) -> bool:
    """Whether the file is one of the shipped examples."""
    return _real(path).parent == EXAMPLES_DIR


def _real(path: Path) -> Path:
    """Path.resolve() without its RuntimeError on a symlink loop (os.path.realpath leaves it as is)."""
    return Path(os.path.realpath(path))


def every() -> dict[str, Path]:
    """Every profile a name finds, by the name that finds it: the profiles folder's, then the shipped
    examples as `example:NAME`, unless the folder is the examples' own (a checkout's profiles/)."""
    found = available()
    if _real(profiles_dir()[0]) == EXAMPLES_DIR:
        return found
    return found | {EXAMPLE + name: path for name, path in examples().items()}


def resolve_path(ref: str) -> Path:
    """A profile name (from the profiles folder), a shipped example (`example:NAME`) or a path to a
    YAML file.

    The rule is by spelling, never by what happens to exist: `base` is always the profiles
    folder's, `example:base` always the shipped one, `./base.yml` always a file, so a stray file in
    the working directory cannot shadow a profile, and a name can never climb out of its folder.
    """
    if ref.startswith(EXAMPLE):
        shipped = examples()
        where = f"shipped examples: {', '.join(shipped)}"
        return _by_name(ref.removeprefix(EXAMPLE), shipped, where, prefix=EXAMPLE)
    if ref.endswith((".yml", ".yaml")) or "/" in ref:
        path = Path(ref)
        try:  # not is_file(), which says False for a symlink loop and lets resolve() raise on it
            found = stat.S_ISREG(os.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            found = False
        except OSError as exc:  # a name over 255 bytes, a folder it may not search, a symlink loop
            if exc.errno == errno.ELOOP:
                raise InputError(
                    f"profile file {_short(ref, 300)} is a symlink loop: point the link at a file"
                ) from None
            raise InputError(f"no profile file {_short(ref)}: {exc.strerror or exc} ({PATH_RULE})") from None
        if not found:
            raise InputError(f"no profile file {_short(ref)} ({PATH_RULE})")
        return path
    folder, label = profiles_dir()
    profiles = available()
    if ref not in profiles and ref in examples():  # the likeliest fix, from an empty directory
        raise InputError(
            f"unknown profile {_short(ref)} (the shipped example is {EXAMPLE}{ref}); "
            f"{'not in' if folder.is_dir() else 'no folder'} {label} ({PATH_RULE})"
        )
    where = f"no folder {label}"
    if folder.is_dir():
        where = f"profiles in {label}: {', '.join(profiles) or 'none'}"
    return _by_name(ref, profiles, where)


def _by_name(name: str, found: dict[str, Path], where: str, prefix: str = "") -> Path:
    """`found[name]`, else an error saying where it was looked for, with a close name if one is."""
    if name in found:
        return found[name]
    close = difflib.get_close_matches(name, found, n=1) if len(name) < 100 else []
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    raise InputError(f"unknown profile {_short(prefix + name)}{hint}; {where} ({PATH_RULE})")


def _short(value: Any, limit: int = 60) -> str:
    """repr() for messages: escapes NULs and lone surrogates (which no terminal can print), cut short."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _read_yaml(path: Path) -> dict[str, Any]:
    """The file's mapping, read as YAML 1.2 (yaml12); bad bytes, bad YAML, an over-large file and
    alias bombs are input errors, not crashes."""
    try:
        # Bytes, not text: PyYAML honours a BOM and names the offset of invalid UTF-8.
        raw = yaml12.read_bytes(path)
        breaks = _yaml11_breaks(path, raw)
        if breaks:
            raise ProfileError(breaks)
        loader = yaml12.Loader(raw)
        loader.max_nodes = MAX_VALUES
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml12.TooLarge as exc:
        raise InputError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {yaml12.reason(exc)}") from None
    except RecursionError:
        raise InputError(f"{path}: not valid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__mro__[-2].__name__  # yaml12's Int is an int, its Plain a str
        raise InputError(f"{path}: a profile must be a mapping, got {kind}")
    _check_shape(data, path, loader.aliased)
    return data


#: Characters that PyYAML's scanner (YAML 1.1), which reads profiles, takes for line breaks, and YAML
#: 1.2 for text; with the escape that writes each in a double-quoted string.
_YAML11_BREAKS = {
    "\x85": ("NEL", "\\N"),
    "\u2028": ("LINE SEPARATOR", "\\L"),
    "\u2029": ("PARAGRAPH SEPARATOR", "\\P"),
}
_YAML11_BREAK = re.compile("[\x85\u2028\u2029]")


def _yaml11_breaks(path: Path, raw: bytes) -> list[Problem]:
    """U+0085, U+2028 and U+2029 written as is, one problem per field: they have two readings.

    As a line break, NEL in a quoted value becomes a space, spaces beside any of them are dropped,
    and one in a comment ends it (the rest is read as YAML). systemd keeps each as written, so the
    server would get other text than the file shows. Written as an escape, each reaches it intact.
    """
    text = _decoded(raw)
    if text is None or not _YAML11_BREAK.search(text):
        return []
    found = list(_YAML11_BREAK.finditer(text))
    problems: dict[str, Problem] = {}
    for match, loc in zip(found, _fields_at(raw, [m.start() for m in found]), strict=True):
        index, (name, escape) = match.start(), _YAML11_BREAKS[match.group()]
        line, column = text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)
        problems.setdefault(
            loc,
            Problem(
                _display(path),
                loc,
                f"line {line}, column {column}: U+{ord(match.group()):04X} ({name}) is written as is: the "
                "YAML 1.1 reader of profiles takes it for a line break, YAML 1.2 for text, so the text read "
                f"is not the text written; write it as {escape} in a double-quoted string, or remove it",
            ),
        )
    return list(problems.values())


def _decoded(raw: bytes) -> str | None:
    """The file's text as PyYAML's reader decodes it (UTF-16 after its BOM, else UTF-8), or None."""
    encoding = "utf-8"
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16-le" if raw.startswith(codecs.BOM_UTF16_LE) else "utf-16-be"
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        return None  # PyYAML says where


def _fields_at(raw: bytes, indexes: list[int]) -> list[str]:
    """The field whose key or value holds each character index of the file: "" where none does (a
    comment, or a file that does not parse). Walks each node once (aliases may loop)."""
    loader = yaml12.Loader(raw)
    loader.max_nodes = MAX_VALUES
    try:
        root = loader.get_single_node()
    except (yaml.YAMLError, RecursionError):
        root = None
    finally:
        loader.dispose()
    spans: list[tuple[int, int, str]] = []
    stack: list[tuple[str, yaml.Node | None]] = [("", root)]
    seen: set[int] = set()
    while stack:
        loc, node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            spans.append((node.start_mark.index, node.end_mark.index, loc))
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                stack += [(f"{loc}.{name}" if loc else name, key), (f"{loc}.{name}" if loc else name, value)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(f"{loc}[{i}]", item) for i, item in enumerate(node.value)]
    return [next((loc for start, end, loc in spans if start <= i < end), "") for i in indexes]


def _check_shape(data: dict[str, Any], path: Path, aliased: bool) -> None:
    """Refuse alias bombs and self-referencing aliases, and strings no unit file can hold.

    Walks the values as if aliases were expanded, without recursion, stopping at the limits;
    the hint about aliases only where the file has some (`aliased`).
    """
    problems: list[Problem] = []
    stack: list[tuple[str, Any, int]] = [("", data, 0)]
    walked = 0
    while stack:
        loc, value, depth = stack.pop()
        walked += 1
        if walked > MAX_VALUES:
            if aliased:
                raise InputError(
                    f"{path}: expands to over {MAX_VALUES} values; are aliases nested in aliases?"
                )
            raise InputError(f"{path}: has over {MAX_VALUES} values; no profile comes near that")
        if depth > MAX_DEPTH:
            if aliased:
                raise InputError(
                    f"{path}: nested more than {MAX_DEPTH} levels (an alias inside its own anchor?)"
                )
            raise InputError(f"{path}: nested more than {MAX_DEPTH} levels; a profile needs three")
        if isinstance(value, dict):
            for key, item in value.items():
                problems += _bad_string(path, loc, key)
                stack.append((f"{loc}.{key}" if loc else str(key), item, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{loc}[{i}]", item, depth + 1) for i, item in enumerate(value))
        else:
            problems += _bad_string(path, loc, value)
    if problems:
        raise ProfileError(problems)


def _bad_string(path: Path, loc: str, value: Any) -> list[Problem]:
    """NUL cannot reach argv or a unit file; a lone surrogate is not UTF-8 (`"\\uD800"` in YAML); a
    noncharacter (`"\\uFDD0"`) is not UTF-8 to systemd, which drops the unit line holding it."""
    if not isinstance(value, str):
        return []
    if "\0" in value:
        return [Problem(_display(path), loc, f"{_short(value)}: contains a NUL character")]
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        return [Problem(_display(path), loc, f"{_short(value)}: contains an unpaired UTF-16 surrogate")]
    odd = systemd_rules.noncharacter(value)
    if odd:
        return [
            Problem(
                _display(path),
                loc,
                f"{_short(value)}: contains U+{ord(odd):04X}, a Unicode noncharacter, which systemd refuses "
                "as not UTF-8 (it would drop the unit's line); remove it",
            )
        ]
    return []


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings; a list or scalar in `override` replaces; `null` resets to the default."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def load_raw(ref: str, _seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], Path]:
    """The merged mapping of a profile and its `extends` chain, and the file it came from."""
    path = resolve_path(ref)
    data = _read_yaml(path)
    key = str(_real(path))
    if key in _seen:
        raise InputError(f"{path}: extends: cycle through {path.stem}")
    parent = data.get("extends")
    if parent is not None:
        if not isinstance(parent, str):
            raise InputError(f"{path}: extends: must be a profile name")
        ref_parent = _parent_ref(parent, path)
        try:
            resolve_path(ref_parent)
        except InputError as exc:  # name the file that says `extends:`, not only the missing one
            raise InputError(f"{path}: extends: {exc}") from None
        parent_data, _ = load_raw(ref_parent, (*_seen, key))
        parent_data.pop("name", None)
        parent_data.pop("description", None)
        data = merge(parent_data, {k: v for k, v in data.items() if k != "extends"}) | {"extends": parent}
    data.setdefault("name", path.stem)
    return data, path


def _parent_ref(parent: str, child: Path) -> str:
    """`extends:` spelled as `-p` is, except that a path is relative to the file saying it, and a
    shipped example's bare names are the examples' own (its `extends: base` is `example:base`)."""
    if parent.startswith(EXAMPLE):
        return parent
    if "/" in parent or parent.endswith((".yml", ".yaml")):
        # realpath, not Path.resolve(), which raises on a symlink loop: resolve_path names the loop
        return os.path.realpath(child.parent / parent)
    return EXAMPLE + parent if is_example(child) else parent


def load(ref: str) -> Profile:
    """Load, merge and validate a profile by name or path; raises ProfileError with every problem."""
    data, path = load_raw(ref)
    return validate(data, source=_display(path))


def _display(path: Path) -> str:
    try:
        return str(_real(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --- Validation ---------------------------------------------------------------------


def validate(data: dict[str, Any], source: str = "<profile>") -> Profile:
    """Validate a merged profile mapping; report every problem, not just the first."""
    problems = _schema_problems(data, source)
    if not problems:
        profile = Profile.model_validate(data)
        problems = [Problem(source, loc, msg) for loc, msg in _rule_findings(profile)]
        if not problems:
            return profile
    else:
        # Section models that validated on their own still get their cross-field rules,
        # so a typo in `server` does not hide a broken draft tree in `speculative`.
        problems += [Problem(source, loc, msg) for loc, msg in _partial_rule_findings(data)]
    raise ProfileError(_dedupe(problems))


_SectionT = TypeVar("_SectionT", Server, Speculative)


def _rule_findings(profile: Profile) -> list[sglang_rules.Finding]:
    """Every cross-field problem of a schema-valid profile."""
    return [
        # Every field of `speculative` by name: a new field the rules do not take fails loudly.
        *sglang_rules.check_speculative(**profile.speculative.model_dump()),
        *_server_findings(profile.server),
        *_across_findings(profile.server, profile.speculative),
        *sglang_rules.check_nccl(profile.nccl),
        *sglang_rules.check_env(profile.env),
        *sglang_rules.check_secret_env(list(profile.secret_env), profile.env, profile.nccl),
        *sglang_rules.check_gpu_set(profile.server.gpus, profile.server.gpus_needed, profile.deployment.kind),
        *_service_findings(profile),
        *_deployment_findings(profile),
        *_disaggregation_findings(profile),
        *_runtime_findings(profile),
    ]


def _service_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    """Service options that read other sections."""
    svc = profile.service
    if svc.restart == "no":
        set_only_for_restart = [
            name
            for name in ("restart_sec", "start_limit_burst", "start_limit_interval_s")
            if name in svc.model_fields_set
        ]
        for name in set_only_for_restart:
            yield (
                f"service.{name}",
                "takes effect only with service.restart: on-failure; set that or drop it",
            )
    yield from _unit_name_findings(profile)


def _unit_name_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    """service.unit_name as the things named after it read it: a container, and the unit's own
    settings (CacheDirectory=). One problem at most: both ask for the same characters."""
    name = profile.service.unit_name
    problem = None
    if profile.runtime.container:
        problem = container_rules.container_name_problem(PurePosixPath(name).stem)
    problem = problem or systemd_rules.unit_setting_problem(name)
    if problem:
        yield ("service.unit_name", problem)


def _deployment_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    if profile.deployment.kind == "multinode":
        problem = sglang_rules.multinode_port_problem(profile.server.port, profile.deployment.dist_init_port)
        if problem:
            yield ("deployment.dist_init_port", problem)


def _disaggregation_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    """A PD role as SGLang reads it (sglang_rules.check_disaggregation), and what orchestrator
    carries out: a role's server is one host's (docs/pd.md)."""
    pd = profile.disaggregation
    if pd is None:
        return
    if profile.deployment.kind == "multinode":
        yield (
            "disaggregation",
            "a prefill or decode server over several hosts (deployment.kind multinode) is not supported "
            "yet; give each role single-host servers",
        )
    yield from sglang_rules.check_disaggregation(
        sglang_version=profile.server.sglang_version,
        mode=pd.mode,
        transfer_backend=pd.transfer_backend,
        bootstrap_port=pd.bootstrap_port,
        port=profile.server.port,
        cuda_graph=profile.server.cuda_graph,
        extra_args=profile.server.extra_args,
        ib_device=pd.ib_device,
        bind=profile.server.host,
    )


def _runtime_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    """The runtime section against itself and against what a container can carry out."""
    rt = profile.runtime
    if not rt.container:
        for name in sorted(rt.model_fields_set - {"kind"}):
            yield (f"runtime.{name}", "takes effect only with runtime.kind docker or podman; drop it")
        return
    if rt.image is None:
        yield ("runtime.image", f"required for runtime.kind {rt.kind}; e.g. {container_rules.EXAMPLE_IMAGE}")
    if rt.kind == "docker" and rt.cgroups != "split":
        yield ("runtime.cgroups", "is podman's --cgroups; docker has no such option: drop it")
    if rt.kind == "podman" and rt.gpu_devices == "gpus":
        yield (
            "runtime.gpu_devices",
            "gpus is docker's --gpus (NVIDIA's runtime hook); podman takes GPUs as CDI devices only: "
            "set cdi or drop it",
        )
    if rt.shm_size is not None and rt.ipc_host:
        yield (
            "runtime.shm_size",
            "with ipc_host the container uses the host's /dev/shm (podman refuses both); "
            "set ipc_host: false for a private /dev/shm of this size, or drop shm_size",
        )
    yield from _container_service_findings(profile)
    yield from _container_path_findings(profile)


def _container_service_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    """Service settings a container cannot carry out as the host runtime does."""
    svc = profile.service
    if svc.user != "root":
        yield (
            "service.user",
            f"{profile.runtime.kind} runs as root here (the container's user is the image's); rootless "
            "engines are not supported: drop service.user",
        )
    if svc.environment_files:
        yield (
            "service.environment_files",
            "systemd's NAME=\"value\" files do not read the same in the engine's --env-file; "
            "give these variables as secret_env (or env)",
        )
    if svc.limits.nofile == "infinity":
        yield (
            "service.limits.nofile",
            "a container's open files cannot be unlimited (the kernel caps them at fs.nr_open); "
            "give a number such as 1048576",
        )
    for name in ("memlock", "nofile"):
        problem = container_rules.ulimit_problem(getattr(svc.limits, name))
        if problem:
            yield (f"service.limits.{name}", problem)


#: Where systemd makes CacheDirectory= (systemd.exec(5): /var/cache for a system unit).
CACHE_ROOT = "/var/cache"
#: The credential name of the API key's --config file (LoadCredential=NAME:PATH); SGLang reads
#: --config only from a file named .yaml or .yml.
CREDENTIAL = "sglang-config.yaml"
#: The credential name of the --speculative-adaptive-config JSON: the file lives in the root-only
#: state directory, which a non-root service.user cannot read.
ADAPTIVE_CREDENTIAL = "sglang-adaptive.json"


def cache_directory(profile: Profile) -> str:
    """The unit's CacheDirectory= (relative to CACHE_ROOT), "" when service.compile_cache is off."""
    if not profile.service.compile_cache:
        return ""
    return f"orchestrator/{profile.service.unit_name.removesuffix('.service')}"


def credentials_dir(unit_name: str) -> str:
    """What systemd expands ${CREDENTIALS_DIRECTORY} to for this unit (a container mounts the
    --config file there, so the argv inside it is the host runtime's)."""
    return f"/run/credentials/{unit_name}"


def unit_mounts(profile: Profile) -> list[tuple[str, str]]:
    """(owner, target) of what the unit itself mounts into a container (render/launch.py _engine):
    the cache directory, and the credential files where ${CREDENTIALS_DIRECTORY} points."""
    own = []
    cache = cache_directory(profile)
    if cache:
        own.append(("service.compile_cache (the unit's cache directory)", f"{CACHE_ROOT}/{cache}"))
    credentials = credentials_dir(profile.service.unit_name)
    if profile.api_key is not None:
        own.append(("api_key (the --config file)", f"{credentials}/{CREDENTIAL}"))
    adaptive = profile.speculative.adaptive
    if adaptive is not None and adaptive.tiers is not None:
        own.append(("speculative.adaptive.tiers (their config file)", f"{credentials}/{ADAPTIVE_CREDENTIAL}"))
    return own


def model_mounts(profile: Profile) -> list[tuple[str, str]]:
    """(field, path) of what a container runtime mounts read-only at its own path without being
    listed in runtime.mounts: the model, and the drafter when there is one."""
    auto = [("server.model_path", profile.server.model_path)]
    if profile.speculative.draft_model_path:
        auto.append(("speculative.draft_model_path", profile.speculative.draft_model_path))
    return auto


def _container_path_findings(profile: Profile) -> Iterator[sglang_rules.Finding]:
    """Model and drafter are mounted at their own paths, beside the unit's own mounts (unit_mounts);
    no mount may land on the same target as the engines clean it (`/data/m/.` is `/data/m`): podman
    refuses a "duplicate mount destination", docker a "duplicate mount point"."""
    own = {container_rules.clean_path(target): owner for owner, target in unit_mounts(profile)}
    targets = dict(own)
    for loc, path in model_mounts(profile):
        problem = container_rules.mount_source_problem(path)
        if problem:
            yield (loc, f"is mounted into the container at its own path: {problem}")
        target = container_rules.clean_path(path)
        if target in own:
            yield (
                loc,
                f"{path} is mounted into the container at its own path, where {own[target]} is mounted "
                "already: the engines refuse two mounts on one path; move it",
            )
        targets.setdefault(target, loc)
    for i, mount in enumerate(profile.runtime.mounts):
        target = container_rules.clean_path(mount.target)
        if target in targets:
            yield (
                f"runtime.mounts.{i}.target",
                f"{mount.target} is already mounted by {targets[target]}: choose another target",
            )
        targets.setdefault(target, f"runtime.mounts.{i}")


def notes(profile: Profile) -> list[str]:
    """Warnings about a valid profile, for `render` and `validate` to show (on stderr)."""
    image = profile.runtime.image
    note = container_rules.image_note(image) if image else None
    return [note] if note else []


def _server_findings(server: Server) -> Iterator[sglang_rules.Finding]:
    return sglang_rules.check_server(
        sglang_version=server.sglang_version,
        cuda_graph=server.cuda_graph,
        cuda_graph_max_bs=server.cuda_graph_max_bs,
        served_model_name=server.served_model_name,
        extra_args=server.extra_args,
    )


def _across_findings(server: Server, spec: Speculative) -> Iterator[sglang_rules.Finding]:
    """Rules that read the server and speculative sections together."""
    yield from sglang_rules.check_parallel(
        sglang_version=server.sglang_version,
        tp_size=server.tp_size,
        dp_size=server.dp_size,
        extra_args=server.extra_args,
    )
    yield from sglang_rules.check_speculative_server(
        sglang_version=server.sglang_version,
        algorithm=spec.algorithm,
        eagle_topk=spec.eagle_topk,
        adaptive=spec.adaptive is not None,
        dp_size=server.dp_size,
        extra_args=server.extra_args,
    )


def _partial_rule_findings(data: dict[str, Any]) -> list[sglang_rules.Finding]:
    """The rules of each section that validates on its own, when the whole profile does not."""
    findings: list[sglang_rules.Finding] = []
    spec = _section(Speculative, data.get("speculative", {}))
    if spec is not None:
        findings += sglang_rules.check_speculative(**spec.model_dump())
    server = _section(Server, data.get("server"))
    if server is not None:
        findings += _server_findings(server)
    elif isinstance(data.get("server"), dict):
        # A typo elsewhere in `server` must not hide a bad extra arg.
        raw = data["server"]
        version, extra = raw.get("sglang_version", "0.5.9"), raw.get("extra_args", [])
        if isinstance(version, str) and not sglang_flags.version_problem(version) and isinstance(extra, list):
            findings += sglang_rules.check_extra_args(version, [str(a) for a in extra])
    if isinstance(data.get("nccl"), dict):
        findings += sglang_rules.check_nccl({str(k): str(v) for k, v in data["nccl"].items()})
    if isinstance(data.get("env"), dict):
        findings += sglang_rules.check_env({str(k): str(v) for k, v in data["env"].items()})
    return findings


def _section(model: type[_SectionT], value: Any) -> _SectionT | None:
    """The section as its model, or None where it does not validate on its own."""
    if not isinstance(value, dict):
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.loc, p.message) not in seen:
            seen.add((p.loc, p.message))
            out.append(p)
    return out


def _schema_problems(data: dict[str, Any], source: str) -> list[Problem]:
    try:
        Profile.model_validate(data)
    except ValidationError as exc:
        return [_problem_from_pydantic(err, source, data) for err in exc.errors()]
    return []


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] | None = None) -> type[BaseModel] | None:
    """The model class that owns the field at `loc` (for did-you-mean on unknown keys), from
    `root` (default: Profile)."""
    model: type[BaseModel] | None = root or Profile
    for part in loc[:-1]:
        if model is None:
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        # `Annotated[Model, ...] | None` holds the model as its first branch's __origin__.
        branches = [getattr(a, "__origin__", a) for a in getattr(ann, "__args__", (ann,))]
        candidates = [a for a in branches if isinstance(a, type)]
        model = next((a for a in candidates if issubclass(a, BaseModel)), None)
    return model


def _user_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """The location as the user wrote it.

    Pydantic puts union branches (`ApiKey`, `literal[...]`) and `[key]` into locations; users
    never wrote those. Telling them apart by their spelling alone would also drop a key the
    user did write, such as `Server:` or `NCCL_ALGO:`, so a part stays when the data has it
    (or when it is the last part: a missing field).
    """
    out: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        in_data = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        )
        if in_data:
            node = node[part]
        elif part == "[key]" or i < len(loc) - 1:
            continue
        out.append(part)
    return tuple(out)


def _problem_from_pydantic(
    err: ErrorDetails, source: str, data: dict[str, Any], root: type[BaseModel] | None = None
) -> Problem:
    loc = _user_loc(tuple(err["loc"]), data)
    dotted = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        owner = _model_at(loc, root)
        known = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(known)}"
        return Problem(source, dotted, f"unknown key{hint}")
    if err["type"] == "missing":
        return Problem(source, dotted, "required; add it (or inherit it with `extends: base`)")
    msg = err["msg"]
    if err["type"] == "string_pattern_mismatch" and "^/" in msg:
        msg = f"must be an absolute path, got {_short(err['input'])}"
    elif err["type"].startswith("value_error"):
        msg = msg.removeprefix("Value error, ")
    else:
        msg = f"{msg}, got {_short(err.get('input'))}"
    return Problem(source, dotted, msg)


__all__ = [
    "Adaptive",
    "ApiKey",
    "Mount",
    "Profile",
    "Runtime",
    "Server",
    "Service",
    "Speculative",
    "available",
    "every",
    "examples",
    "load",
    "sglang_flags",
    "validate",
]
