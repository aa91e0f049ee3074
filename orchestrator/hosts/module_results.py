"""Results in: what each host module (plugins/modules/*.py) returns, typed.

One pydantic model per module. Its fields are the keys the module's RETURN block documents. Their
descriptions are there, in one place. tests/unit/test_results.py checks, both ways, that the two
name the same fields with compatible types. The module tests validate the results the real modules
return against these models.

A result is read only through `parse`. It names the module and the field when the two differ. So a
renamed `restart_needed` fails here, instead of reading as False.

A failed module returns Ansible's `msg` with whatever it knew when it failed. That ranges from
nothing (a bad argument, systemctl failing) to its whole result (preflight's problems). So its
failure model has every field of the success model as optional. It adds what RETURN says only a
failure returns, such as the health wait's journal. Unknown fields are errors either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from orchestrator.errors import OrchestratorError, one_line

PROBE = "sglang_probe"
UNITS = "sglang_units_info"
PREFLIGHT = "sglang_preflight"
STOP = "sglang_stop"
GPU_IDLE = "gpu_idle"
UNIT = "sglang_unit"
START = "sglang_start"
HEALTH = "sglang_health_wait"
RECORD = "sglang_record"
RESTART = "sglang_restart"
GATEWAY = "sglang_gateway"
DRAIN = "sglang_drain"
LOCK = "sglang_lock"
ADOPT = "sglang_adopt"

#: Keys that Ansible, not the module, puts in a task's result (ansible-core's task executor and
#: module runner, ansible-runner's events), and orchestrator's own `ansible_msg`
#: (runner._explain_become keeps Ansible's msg there). Every `_ansible_*` key is Ansible's too.
#: A module whose RETURN documents one of them (sglang_unit's `diff`) has it as a field.
ANSIBLE_KEYS = frozenset(
    {
        "changed",
        "failed",
        "skipped",
        "skip_reason",
        "false_condition",
        "unreachable",
        "msg",
        "invocation",
        "warnings",
        "deprecations",
        "exception",
        # a module that died or printed no JSON ("MODULE FAILURE")
        "module_stdout",
        "module_stderr",
        "rc",
        "diff",
        # interpreter discovery's `discovered_interpreter_python`
        "ansible_facts",
        "censored",
        "failed_when_result",
        "attempts",
        "retries",
        "ansible_msg",
    }
)


class ResultError(OrchestratorError):
    """A host module's result orchestrator cannot read: not the shape orchestrator knows (the two
    come from different versions, or were changed apart: read with defaults, it would be silently
    wrong), or one that never came back."""


class ModuleResult(BaseModel):
    """What one module returned: its own fields, without Ansible's."""

    # strict: a bool is never read out of "false", nor a number out of a string.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _empty_is_none(value: object) -> object:
    return None if value == {} else value


# --- GPUs: gpu_idle's result, and sglang_stop's `gpus` ------------------------------------------


class Gpu(ModuleResult):
    """One GPU as nvidia-smi reports it; a memory figure is None where it printed `[N/A]`."""

    index: int
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None


class GpuProcess(ModuleResult):
    """A process on a GPU; `unit` is the orchestrator unit of the host it runs in, "" for none."""

    gpu: int | None
    pid: int | None
    process_name: str
    used_mib: int | None
    unit: str


class BusyGpu(ModuleResult):
    """A checked GPU that is not idle, with the processes listed on it."""

    index: int
    memory_used_mib: int | None
    holders: list[GpuProcess]


class GpuIdleResult(ModuleResult):
    """gpu_idle (module_utils' wait_idle)."""

    idle: bool
    checked: list[int]
    gpus: list[Gpu]
    holders: list[GpuProcess]
    busy: list[BusyGpu]
    waited_s: float
    killed: list[GpuProcess]


# --- the modules --------------------------------------------------------------------------------


class PreflightResult(ModuleResult):
    """sglang_preflight (module_utils' preflight_checks), and sglang_probe's `preflight`."""

    problems: list[str]
    notes: list[str]
    sglang_version: str
    gpus: int
    help_checked: bool
    verified_digest: str
    #: The GPU memory fit (module_utils memfit.predict); {} where it did not run.
    memory: dict[str, Any]
    #: The model's and drafter's fingerprints ({"model": ..., "draft": ...}, modelfiles.scan).
    model_files: dict[str, Any]


class ProbeResult(ModuleResult):
    """sglang_probe."""

    installed: bool
    digest: str
    profile: str
    unit: str
    #: What sglang_unit stored with the unit; a host's file, whatever version wrote it.
    facts: dict[str, Any]
    health_url: str
    health_status: int | None
    healthy: bool
    #: systemctl show's properties, as it prints them.
    state: dict[str, str]
    uptime_s: float | None
    restart_needed: bool
    reasons: list[str]
    #: sglang_record's file {profile, digest, unit, time, facts}, whatever version wrote it.
    last_good: dict[str, Any]
    locked: bool
    #: None where the module returned {} (the checks did not run).
    preflight: Annotated[PreflightResult | None, BeforeValidator(_empty_is_none)]
    #: What was read into the page cache before the stop (with read_ahead, a restart needed).
    read_ahead: dict[str, Any] | None = None
    #: What the play does next on this host, decided by the probe; the playbooks only route it.
    end_play: bool
    wait_health: bool
    record: bool
    release_run_id: str
    release_on_failure: bool
    journal: bool


class Launcher(ModuleResult):
    """How a hand-started server was started: nohup, tmux, screen, a unit, a container, a shell or
    init; `detail` names it (the unit, the tmux server's PID, the log nohup writes)."""

    kind: Literal["nohup", "tmux", "screen", "unit", "container", "shell", "init"]
    detail: str


class ForeignServer(ModuleResult):
    """An SGLang server on the host that no orchestrator unit runs (sglang_units_info's `foreign`)."""

    pid: int
    user: str
    #: Its start, in seconds since the epoch.
    started: float
    ports: list[int]
    launcher: Launcher
    #: Its argv, each secret flag's value as `<secret>`.
    argv: list[str]
    #: The file its stdout writes; "" for none.
    log: str


class UnitsInfoResult(ModuleResult):
    """sglang_units_info."""

    units: list[str]
    foreign: list[ForeignServer]


class StopResult(ModuleResult):
    """sglang_stop."""

    was_active: bool
    main_pid: int
    stop_s: float
    disabled: bool
    gpus: GpuIdleResult


class UnitDiff(ModuleResult):
    """The unit text before and after, in Ansible's diff form."""

    before_header: str
    after_header: str
    before: str
    after: str


class UnitResult(ModuleResult):
    """sglang_unit."""

    digest: str
    unit_path: str
    #: In diff mode only.
    diff: UnitDiff | None = None


class StartResult(ModuleResult):
    """sglang_start."""

    reloaded: bool
    enabled: bool
    started: bool
    invocation_id: str


class RestartStep(ModuleResult):
    """One step of sglang_restart: the module whose step it is, and that module's own result (read
    as that module's: runner.split_steps makes it an event of its own)."""

    action: Literal[
        "sglang_adopt", "sglang_stop", "sglang_unit", "sglang_start", "sglang_health_wait", "sglang_record"
    ]
    failed: bool
    took_s: float
    result: dict[str, Any]


class AdoptServer(ModuleResult):
    """One SGLang server sglang_adopt found: what the host runs, secrets redacted."""

    pid: int
    ppid: int
    uid: int
    user: str
    #: Its start, in seconds since the epoch.
    started: float
    #: Field 22 of /proc/PID/stat: with the PID, it names this process (Takeover.start_ticks).
    start_ticks: int
    #: /proc/PID/cmdline (a container's: its Entrypoint and Cmd), a secret flag's value `<secret>`.
    argv: list[str]
    #: /proc/PID/environ (a container's: its Env), a secret variable's value `<secret>`.
    env: dict[str, str]
    #: {flag or variable: sha256 of its value} of each value redacted.
    secrets: dict[str, str]
    cwd: str
    exe: str
    #: The home and login shell of its user's passwd entry ("" without one): systemd's User= gives
    #: them as $HOME and $SHELL.
    home: str = ""
    shell: str = ""
    #: argv[0] made absolute (the process's own PATH; else exe).
    python: str
    entry: Literal["module", "serve"]
    ports: list[int]
    gpus: list[int]
    launcher: Launcher
    #: Its systemd unit; "" for a login session's scope or none.
    unit: str
    #: Whether that unit is one orchestrator deployed.
    ours: bool
    log: str
    log_err: str
    #: {} or {engine, id, name, image}.
    container: dict[str, str]
    #: Its CPU affinity, /proc/PID/status Cpus_allowed_list, where it leaves out an online CPU
    #: (taskset, numactl, a cpuset); "" where it may run on every one.
    cpus_allowed: str = ""
    #: Its Mems_allowed_list where it leaves out an online NUMA node (a cpuset); "" otherwise.
    mems_allowed: str = ""


class AdoptResult(ModuleResult):
    """sglang_adopt: find (servers, sglang_version, problems), takeover (taken ... launcher) or
    relaunch (pid, healthy, took_s, log, argv); `action` says which."""

    action: Literal["find", "takeover", "relaunch"]
    servers: list[AdoptServer] | None = None
    sglang_version: str | None = None
    #: find: the service manager's $PATH, which a unit gets ("" unknown).
    systemd_path: str | None = None
    #: find: the units orchestrator deployed on the host.
    units: list[str] | None = None
    problems: list[str] | None = None
    taken: bool | None = None
    why: str | None = None
    pid: int | None = None
    killed: list[int] | None = None
    log: str | None = None
    record_path: str | None = None
    #: {} where nothing was taken.
    launcher: Annotated[Launcher | None, BeforeValidator(_empty_is_none)] = None
    took_s: float | None = None
    healthy: bool | None = None
    #: relaunch: the new process's start time (field 22 of /proc/PID/stat).
    start_ticks: int | None = None
    argv: list[str] | None = None


class RestartResult(ModuleResult):
    """sglang_restart: stop, unit, start, the health wait's first report_s and the record in one run."""

    steps: list[RestartStep]
    failed_step: str
    done: bool
    recorded: bool
    released: bool
    invocation_id: str


HealthReason = Literal["healthy", "exited", "restarted", "stalled", "timeout", "starting"]


class Phase(ModuleResult):
    """One start-up phase and its seconds so far (startup_watch.PHASES names them)."""

    phase: str
    s: float


class Progress(ModuleResult):
    """A phase's progress bar as last drawn: done of total, and what it is at ("bs 96")."""

    done: int
    total: int
    detail: str = ""


class Stalled(ModuleResult):
    """The phase that went past its stall limit."""

    phase: str
    limit_s: float
    quiet_s: float


class HealthResult(ModuleResult):
    """sglang_health_wait (also each report of a start still under way: done false)."""

    elapsed_s: float
    status: int | None
    unit_state: dict[str, str]
    reason: HealthReason
    #: Start-up, read from the server's log (startup_watch.PHASES).
    done: bool
    phase: str
    progress: Progress | None
    phase_s: float
    quiet_s: float
    phases: list[Phase]
    eta_s: float | None
    lines: int
    #: The server's lines on its memory (memfit.parse_memory_lines reads them).
    memory_lines: list[str]


class RecordResult(ModuleResult):
    """sglang_record."""

    recorded: bool
    released: bool


class GatewayResult(ModuleResult):
    """sglang_gateway."""

    state: Literal["absent", "present"]
    #: The gateway's listing of the worker ({listed, is_healthy, load}), as reports show it.
    before: dict[str, Any]
    after: dict[str, Any]
    #: The play's decision: drain before the stop (this call took the worker out).
    drain: bool


class DrainResult(ModuleResult):
    """sglang_drain."""

    mode: Literal["drain", "prove"]
    in_flight: int
    waited_s: float
    timed_out: bool
    status: int | None


class LockResult(ModuleResult):
    """sglang_lock."""

    released: bool
    #: When another run holds the lock: its content.
    holder: dict[str, Any] | None = None


# --- failures: what each module returns when it fails --------------------------------------------
# Every field of its success model, optional (the module failed before it knew it), plus what
# RETURN says only a failure returns; none unknown. Written out, not derived from the success
# model, so that a type checker sees them: tests/unit/test_results.py checks each field against
# the success model's and the module's RETURN.


class GpuIdleFailed(ModuleResult):
    """gpu_idle, failed: whatever it knew when it failed."""

    idle: bool | None = None
    checked: list[int] | None = None
    gpus: list[Gpu] | None = None
    holders: list[GpuProcess] | None = None
    busy: list[BusyGpu] | None = None
    waited_s: float | None = None
    killed: list[GpuProcess] | None = None


class PreflightFailed(ModuleResult):
    """sglang_preflight (and sglang_probe's `preflight`), failed: whatever it knew when it failed."""

    problems: list[str] | None = None
    notes: list[str] | None = None
    sglang_version: str | None = None
    gpus: int | None = None
    help_checked: bool | None = None
    verified_digest: str | None = None
    memory: dict[str, Any] | None = None
    model_files: dict[str, Any] | None = None


class ProbeFailed(ModuleResult):
    """sglang_probe, failed: whatever it knew when it failed."""

    installed: bool | None = None
    digest: str | None = None
    profile: str | None = None
    unit: str | None = None
    facts: dict[str, Any] | None = None
    health_url: str | None = None
    health_status: int | None = None
    healthy: bool | None = None
    state: dict[str, str] | None = None
    uptime_s: float | None = None
    restart_needed: bool | None = None
    reasons: list[str] | None = None
    last_good: dict[str, Any] | None = None
    locked: bool | None = None
    preflight: Annotated[PreflightResult | None, BeforeValidator(_empty_is_none)] = None
    read_ahead: dict[str, Any] | None = None
    end_play: bool | None = None
    wait_health: bool | None = None
    record: bool | None = None
    release_run_id: str | None = None
    release_on_failure: bool | None = None
    journal: bool | None = None
    #: Failure only: the content of the lock another run holds.
    lock_holder: dict[str, Any] | None = None


class UnitsInfoFailed(ModuleResult):
    """sglang_units_info, failed: whatever it knew when it failed."""

    units: list[str] | None = None
    foreign: list[ForeignServer] | None = None


class StopFailed(ModuleResult):
    """sglang_stop, failed: whatever it knew when it failed."""

    was_active: bool | None = None
    main_pid: int | None = None
    stop_s: float | None = None
    disabled: bool | None = None
    #: wait_idle fails with nvidia-smi's GPU list as `gpus` when a GPU of the set is missing: the
    #: shape of gpu_idle's `gpus`, which sglang_stop returns as it is (RETURN says so).
    gpus: GpuIdleResult | list[Gpu] | None = None


class UnitFailed(ModuleResult):
    """sglang_unit, failed: whatever it knew when it failed."""

    digest: str | None = None
    unit_path: str | None = None
    diff: UnitDiff | None = None


class StartFailed(ModuleResult):
    """sglang_start, failed: whatever it knew when it failed."""

    reloaded: bool | None = None
    enabled: bool | None = None
    started: bool | None = None
    invocation_id: str | None = None


class HealthFailed(ModuleResult):
    """sglang_health_wait, failed: whatever it knew when it failed."""

    elapsed_s: float | None = None
    status: int | None = None
    unit_state: dict[str, str] | None = None
    reason: HealthReason | None = None
    done: bool | None = None
    phase: str | None = None
    progress: Progress | None = None
    phase_s: float | None = None
    quiet_s: float | None = None
    phases: list[Phase] | None = None
    eta_s: float | None = None
    lines: int | None = None
    memory_lines: list[str] | None = None
    #: Failure only: the phase that went past its stall limit.
    stalled: Stalled | None = None
    #: Failure only: the last journal lines of this start of the unit.
    journal: list[str] | None = None


class RestartFailed(ModuleResult):
    """sglang_restart, failed: the steps that ran, the last the one that failed."""

    steps: list[RestartStep] | None = None
    failed_step: str | None = None
    done: bool | None = None
    recorded: bool | None = None
    released: bool | None = None
    invocation_id: str | None = None


class AdoptFailed(AdoptResult):
    """sglang_adopt, failed: whatever it knew when it failed (AdoptResult's fields, none sure)."""

    action: Literal["find", "takeover", "relaunch"] | None = None  # type: ignore[assignment]


class RecordFailed(ModuleResult):
    """sglang_record, failed: whatever it knew when it failed."""

    recorded: bool | None = None
    released: bool | None = None


class GatewayFailed(ModuleResult):
    """sglang_gateway, failed: whatever it knew when it failed."""

    state: Literal["absent", "present"] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    drain: bool | None = None


class DrainFailed(ModuleResult):
    """sglang_drain, failed: whatever it knew when it failed."""

    mode: Literal["drain", "prove"] | None = None
    in_flight: int | None = None
    waited_s: float | None = None
    timed_out: bool | None = None
    status: int | None = None


class LockFailed(ModuleResult):
    """sglang_lock, failed: whatever it knew when it failed."""

    released: bool | None = None
    holder: dict[str, Any] | None = None


@dataclass(frozen=True)
class Shape:
    """What one module returns: on success (every field it documents as always returned), and on
    failure."""

    ok: type[ModuleResult]
    failed: type[ModuleResult]


SHAPES: dict[str, Shape] = {
    PROBE: Shape(ProbeResult, ProbeFailed),
    UNITS: Shape(UnitsInfoResult, UnitsInfoFailed),
    PREFLIGHT: Shape(PreflightResult, PreflightFailed),
    STOP: Shape(StopResult, StopFailed),
    GPU_IDLE: Shape(GpuIdleResult, GpuIdleFailed),
    UNIT: Shape(UnitResult, UnitFailed),
    START: Shape(StartResult, StartFailed),
    HEALTH: Shape(HealthResult, HealthFailed),
    RECORD: Shape(RecordResult, RecordFailed),
    RESTART: Shape(RestartResult, RestartFailed),
    GATEWAY: Shape(GatewayResult, GatewayFailed),
    DRAIN: Shape(DrainResult, DrainFailed),
    LOCK: Shape(LockResult, LockFailed),
    ADOPT: Shape(AdoptResult, AdoptFailed),
}


def module_fields(action: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `result` that are the module's own: all but Ansible's (ANSIBLE_KEYS), except
    those the module's models name (sglang_unit's `diff`)."""
    shape = SHAPES[action]
    own = shape.ok.model_fields.keys() | shape.failed.model_fields.keys()
    return {
        k: v for k, v in result.items() if k in own or not (k in ANSIBLE_KEYS or k.startswith("_ansible_"))
    }


def parse(action: str, result: Mapping[str, Any], failed: bool, host: str = "") -> ModuleResult:
    """The result a task of module `action` returned, typed: its success model, or its failure
    model when `failed`. ResultError names the host, the module and each field that differs."""
    where = f"{host}: " if host else ""
    if not result and not failed:
        # ansible-runner hands over {} for a result over MAX_EVENT_RES (700 kB).
        said = "did not come back: ansible-runner drops a result over MAX_EVENT_RES (700000 characters)"
        raise ResultError(one_line(f"{where}{action}'s result {said}"))
    shape = SHAPES[action]
    model = shape.failed if failed else shape.ok
    try:
        return model.model_validate(module_fields(action, result))
    except ValidationError as exc:
        raise ResultError(one_line(f"{where}{action} {_said(exc)} ({_differ(action, model)})")) from None


def _said(exc: ValidationError) -> str:
    """What a ValidationError found, as a person reads it: fields missing, unknown, then wrong."""
    missing, unknown, wrong = [], [], []
    for e in exc.errors():
        where = ".".join(str(part) for part in e["loc"])
        if e["type"] == "missing":
            missing.append(repr(where))
        elif e["type"] == "extra_forbidden":
            unknown.append(repr(where))
        else:
            value = repr(e.get("input"))
            value = value if len(value) <= 60 else value[:57] + "..."
            wrong.append(f"returned {where!r} as {value}: {e['msg']}")
    said = [f"returned no {', '.join(missing)}"] if missing else []
    said += [f"returned {', '.join(unknown)}, which orchestrator does not know"] if unknown else []
    return "; ".join(said + wrong)


def _differ(action: str, model: type[ModuleResult]) -> str:
    module = f"plugins/modules/{action}.py"
    return (
        "the host's module and orchestrator differ: "
        f"orchestrator/hosts/module_results.py {model.__name__} reads what {module} returns; "
        "did Ansible run another copy of the module, or was one changed without the other?"
    )
