"""Vars out: the one typed record each host's play reads (`orch`), built from a Profile and its Plan.

Playbooks route `_plan.*` fields to role variables and decide nothing. Whatever a host must know (a
port, a path, a timeout, a GPU set) is computed here, once. `tests/unit/test_seam.py` checks that
every `orch.*` / `_plan.*` name a playbook reads exists here. It also checks that every field here
is read.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from orchestrator.errors import InputError
from orchestrator.hosts import inventory as inventory_mod
from orchestrator.profile import sglang_flags, sglang_rules
from orchestrator.profile.model import Disaggregation, Profile
from orchestrator.render import container_unit, launch
from orchestrator.render.launch import Plan

#: SGLang's own default HTTP port, for a unit whose facts were never recorded.
DEFAULT_PORT = 30000


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostPaths(_Record):
    """Where orchestrator keeps things on a host. The roles have no defaults for these."""

    unit_dir: str = Field("/etc/systemd/system", description="Where the unit file is written.")
    state_dir: str = Field(
        launch.HOST_STATE_DIR,
        description="Root-only: the secret --config, units/<unit>.json facts, last-good/<unit>.json.",
    )
    lock_dir: str = Field("/run/orchestrator", description="Deploy locks (tmpfs: a reboot ends them).")


class UnitFacts(_Record):
    """What a deployed unit means, stored beside it on the host and in the ledger, so that
    rollback, bench and status never read them back out of the unit text."""

    profile: str = Field(description="The profile the unit was rendered from.")
    port: int = Field(description="The server's HTTP port.")
    bind: str = Field(description="The address the server listens on (--host).")
    gpus: list[int] = Field(description="nvidia-smi indexes of the GPUs this host's server uses.")
    health_url: str = Field(description="/health as asked from the host itself (rank 0's for a rank > 0).")
    rank: int = Field(0, description="Node rank of a multi-node server; 0 for a replica.")
    nnodes: int = Field(1, description="Nodes of the server this unit is part of.")
    speculative: bool = Field(False, description="Whether the server runs speculative decoding.")
    model: str = Field(
        "", description="The target model's path: start-up history is kept per model and host."
    )
    adaptive_config: str = Field(
        "",
        description='The --speculative-adaptive-config JSON the server reads ("": none): kept with the '
        "unit, so a rollback writes back the one its unit ran with.",
    )
    pd: dict[str, Any] | None = Field(
        None,
        description="A PD fleet's server: {role, bootstrap_port, transfer_backend}; left out of the "
        "stored facts of any other server.",
    )

    @model_serializer(mode="wrap")
    def _without_pd(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("pd") is None:
            out.pop("pd", None)
        return out


class LockSpec(_Record):
    """The host's deploy lock as this run takes it (roles/sglang_probe)."""

    holder: str = Field(description="user@machine (pid N), shown to a deploy that has to wait.")
    run_id: str = Field(description="This run; only a lock with it is released by this run.")
    profile: str = Field(description="What this run deploys, shown to a deploy that has to wait.")
    ttl_s: float = Field(description="After this long a lock counts as left by a dead deploy.")
    wait_s: float = Field(description="How long to wait for another deploy's lock.")
    control: str = Field(description="The control machine's host name.")
    pid: int = Field(description="This process; a lock from a dead PID of this machine is stale.")
    live_pids: list[int] = Field(description="PIDs running on the control machine now.")
    keep: bool = Field(
        False,
        description="Left held when the run ends, ok or failed (a tune campaign holds its hosts "
        "between trials); a later run under the same run_id without keep releases it.",
    )


class PreflightChecks(_Record):
    """What the host must offer for this plan (roles/sglang_preflight), checked before a stop."""

    python: str
    sglang_version: str
    flags: list[str]
    model_path: str
    draft_model_path: str = ""
    algorithm: str = ""
    #: nvidia-smi indexes of the GPUs this host's server uses: the only GPUs preflight looks at.
    gpus: list[int]
    port: int
    skip_flags_if_digest: str = ""
    allow_gpu_holders: bool = False
    #: The planned unit, for systemd-analyze verify on the host before the stop.
    unit_content: str = ""
    #: service.user: it must exist on the host.
    user: str = "root"
    #: The unit's compile cache directory ("": service.compile_cache off): room for the caches.
    cache_dir: str = ""
    #: runtime.kind docker or podman ("": SGLang runs on the host's `python`): preflight then checks
    #: the engine, `image` (present, or pulled at start as `pull` allows) and the image's own SGLang
    #: version and --help, with `python` the image's.
    engine: Literal["", "docker", "podman"] = ""
    image: str = ""
    pull: Literal["never", "missing", "always"] = "missing"
    #: runtime.mounts' host paths: each must exist (model and drafter are model_path and
    #: draft_model_path, mounted at their own paths).
    mounts: list[str] = []
    #: The unit's engine options a throw-away container of the image needs on the host too
    #: (container.probe_options: network, cgroups, ulimits).
    run_options: list[str] = []
    #: The unit's whole `run` command after the verb, as systemd runs it (run_words): the engine's
    #: own `create` judges every option before the stop, starting nothing.
    run_words: list[str] = []
    #: The files the unit's write step makes (the --config and adaptive config mounts' sources, the
    #: --env-file): that `create` gets empty ones in their place (they may not be written yet, and
    #: no secret goes into it).
    secret_files: list[str] = []
    #: The server's settings the GPU memory fit needs (memory_settings); {}: no fit.
    memory: dict[str, Any] = {}
    #: What the server logged about its memory on its last start of the same model, TP and GPU.
    calibration: dict[str, Any] = {}
    #: Return every model and drafter file (name, size, sampled digest), to compare across hosts.
    file_lists: bool = False
    #: A hand-started server this deploy takes over (Takeover.pid; 0: none). Its port and its
    #: GPUs are not a problem: the restart stops it first.
    takeover_pid: int = 0
    #: Its start time (Takeover.start_ticks): a PID that another process has since is not it.
    takeover_start_ticks: int = 0
    #: A prefill or decode server's role ({}: none): {transfer_backend, bootstrap_port (0: a
    #: decode server opens none), ib_devices (every device disaggregation.ib_device names)}.
    pd: dict[str, Any] = {}


class Takeover(_Record):
    """A server started by hand (`orchestrator adopt`) that the restart stops first: the process,
    known by its PID and its start time (a PID reused since is another process, never stopped)."""

    pid: int = Field(description="The hand-started server's PID.")
    start_ticks: int = Field(
        description="Its start time, field 22 of /proc/PID/stat (clock ticks after boot)."
    )


class GatewayPlan(_Record):
    """The SGLang gateway (smg) in front of a host's server, for a rollout that drains it
    (roles/sglang_gateway, roles/sglang_drain). Its admin API key is the inventory's
    `orchestrator_gateway_api_key`, which the play reads itself: never in these vars."""

    url: str = Field(description="The gateway's base URL (orchestrator_gateway_url).")
    worker_url: str = Field(description="The URL the gateway knows this host's server by.")
    server_url: str = Field(description="The server's base URL as reached from the host itself.")
    drain_timeout_s: float = Field(60.0, description="How long to wait for requests in flight.")
    add_timeout_s: float = Field(120.0, description="How long the gateway may take to list it healthy.")
    rejoin: bool = Field(
        True, description="Put it back once it generates (a canary stays out to be benched)."
    )
    role: Literal["", "prefill", "decode"] = Field(
        "", description="Its role in a PD fleet: the gateway lists it with it (docs/pd.md)."
    )
    bootstrap_port: int = Field(0, description="A prefill server's bootstrap port (0: none).")


class HostPlan(_Record):
    """Everything one host's play needs for one deploy (or rollback, or preflight)."""

    unit_name: str
    profile: str
    unit: str = Field(description="The unit text, byte for byte what `render` shows.")
    digest: str
    facts: UnitFacts
    paths: HostPaths = Field(default_factory=HostPaths)
    secret_path: str = ""
    #: The unit's secret EnvironmentFile= ("": none), owned by service_user.
    env_file_path: str = ""
    #: The unit's --speculative-adaptive-config file ("": none), written with facts.adaptive_config.
    adaptive_path: str = ""
    service_user: str = "root"
    force_restart: bool = False
    kill_gpu_holders: bool = False
    lock: LockSpec | None = None
    #: None: no checks (already passed in this process, --no-preflight, or a rollback).
    preflight: PreflightChecks | None = None
    health_timeout_s: int = 1800
    health_interval_s: float = 0.25
    #: Seconds without a log line after which each start-up phase counts as stalled (startup.limits);
    #: a phase not in it has no limit but the health timeout.
    stall_s: dict[str, float] = Field(default_factory=dict)
    #: Each phase's usual seconds on this host (startup.usual), for the live view's ETA.
    usual_s: dict[str, float] = Field(default_factory=dict)
    #: The health wait reports where the start stands this often (the live view); 0: only at its end.
    health_report_s: float = 0.0
    gpu_release_timeout_s: float = 30
    #: None: no gateway routes to this host (or --no-drain): the server restarts under its traffic.
    gateway: GatewayPlan | None = None
    #: A rollback's unit, which ran healthy on this host before: written without systemd-analyze
    #: verify, so a line today's checks refuse (one systemd ignores) cannot keep the host from it.
    trusted_digest: str = ""
    #: A rank of a multi-node server: its restart goes a step at a time across all ranks
    #: (restart_lockstep.yml) and it records after the group's health task, never in the one
    #: transaction of a single host.
    lockstep: bool = False
    #: The model directories to read into the page cache before the stop, where a restart is
    #: needed (sglang_probe's read_ahead: dirs, timeout_s, reserve_mib); {}: none.
    read_ahead: dict[str, Any] = Field(default_factory=dict)
    #: A hand-started server to stop before the unit starts (sglang_restart's takeover step); its
    #: command is kept on the host, to start it again if the unit fails. None: none.
    takeover: Takeover | None = None


#: How long a read-ahead of the model's files may take before the stop, at most.
READ_AHEAD_TIMEOUT_S = 900.0
#: Memory a read-ahead leaves to the host: it reads only a model that fits in MemAvailable less this.
READ_AHEAD_RESERVE_MIB = 8192


def read_ahead(prof: Profile) -> dict[str, Any]:
    """sglang_probe's read_ahead for `prof`: its model and drafter directories."""
    dirs = [prof.server.model_path, prof.speculative.draft_model_path or ""]
    return {
        "dirs": [d for d in dirs if d],
        "timeout_s": READ_AHEAD_TIMEOUT_S,
        "reserve_mib": READ_AHEAD_RESERVE_MIB,
    }


class Target(_Record):
    """A unit on every host, for the plays that read or stop it (status, stop)."""

    #: status: "" reports every unit orchestrator deployed on each host; stop needs a name.
    unit_name: str
    paths: HostPaths = Field(default_factory=HostPaths)
    gpu_release_timeout_s: float = 30


class LogsRequest(_Record):
    """journalctl argv for `logs`: hosts in `cursors` continue after their last entry."""

    first_argv: list[str]
    next_argv: list[str]
    cursors: dict[str, str]


class Relaunch(_Record):
    """Where a take-over's unit failed: the unit to stop (and its GPUs to wait for), the process
    that was taken over, and the hand command's health URL."""

    unit_name: str
    health_url: str
    health_timeout_s: float = 600
    gpus: list[int] = Field(default_factory=list)
    pid: int = 0
    start_ticks: int = 0


class AdoptRequest(_Record):
    """adopt's play (playbooks/adopt.yml): find the servers started by hand (`find`: by port, by
    PID, else all), or start the hand command again where its take-over failed (`relaunch`)."""

    action: Literal["find", "relaunch"]
    port: int = 0
    pid: int = 0
    paths: HostPaths = Field(default_factory=HostPaths)
    #: relaunch: host -> its failed unit and the hand command's health URL.
    relaunch: dict[str, Relaunch] = Field(default_factory=dict)


class PlayVars(_Record):
    """The one extra var (`orch`) every playbook reads."""

    hosts: dict[str, HostPlan] = Field(default_factory=dict)
    target: Target | None = None
    logs: LogsRequest | None = None
    adopt: AdoptRequest | None = None
    #: Hosts per batch ("2", "25%"); 0: all at once.
    serial: int | str = 0
    #: Percent of a batch that may fail before no further batch starts (0: one failing ends all).
    max_fail_percent: int = 100
    #: The secrets as JSON ({config, env}) in a 0600 file outside the state directory, only while
    #: the play runs (runner.run_playbook writes and removes it): never in argv, artifacts or vars.
    secret_file: str = ""

    def extravars(self) -> dict[str, Any]:
        return {"orch": self.model_dump(mode="json")}


# --- building ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """One host's share of a profile: its Plan and the facts of its unit."""

    plan: Plan
    facts: UnitFacts
    #: The gateway that routes to this host's server (a multi-node server: rank 0 only).
    gateway: GatewayPlan | None = None


def multinode_hosts(
    prof: Profile, inventory: Path, limit: str | None
) -> list[inventory_mod.InventoryHost] | None:
    """The ranks of a multi-node server, in inventory order; None for a fleet of replicas.

    The kind comes from the profile, or from the hosts' `orchestrator_deployment` variable.
    """
    return _ranks(prof, inventory_mod.hosts(inventory, limit))


def deployment_kind(prof: Profile, host: inventory_mod.InventoryHost) -> str:
    """fleet or multinode: the host's `orchestrator_deployment` variable, else the profile's."""
    return host.deployment or prof.deployment.kind


def _ranks(
    prof: Profile, selected: list[inventory_mod.InventoryHost]
) -> list[inventory_mod.InventoryHost] | None:
    kinds = {deployment_kind(prof, h) for h in selected}
    if "multinode" not in kinds:
        return None
    if len(kinds) > 1:
        raise InputError("the selected hosts mix fleet and multinode deployments; --limit one group")
    port_problem = sglang_rules.multinode_port_problem(prof.server.port, prof.deployment.dist_init_port)
    if port_problem:  # a profile saying `kind: multinode` is refused at validation; an inventory here
        raise InputError(f"{prof.name}: {port_problem}")
    gpus = prof.server.gpus_needed
    if len(selected) < 2 or gpus % len(selected):
        raise InputError(
            f"a multinode server needs 2 or more hosts that split its {gpus} GPUs evenly; "
            f"{len(selected)} selected: {', '.join(h.name for h in selected)}"
        )
    listed = prof.server.gpus
    if listed is not None and len(listed) * len(selected) != gpus:
        raise InputError(
            f"server.gpus lists {len(listed)} GPUs per node; {len(selected)} nodes x {len(listed)} is not "
            f"the {gpus} GPUs TP x DP needs: list {gpus // len(selected)} GPUs, or select "
            f"{gpus // len(listed)} hosts"
        )
    return selected


def placements(prof: Profile, inventory: Path, limit: str | None) -> dict[str, Placement]:
    """Each selected host's plan and unit facts, in inventory order: a replica gets the profile's
    plan; a multi-node rank its own (--nnodes, --node-rank, rank 0's address) and its share of
    the GPUs."""
    selected = inventory_mod.hosts(inventory, limit)  # read once: it is the cache file, or Ansible
    selected = role_hosts(prof, selected, inventory, limit)
    ranks = _ranks(prof, selected)
    if not ranks:
        plan, facts = launch.build(prof), unit_facts(prof)
        return {h.name: Placement(plan, facts, gateway_plan(h, facts, prof.disaggregation)) for h in selected}
    addr = f"{ranks[0].address}:{prof.deployment.dist_init_port}"
    out = {}
    for rank, host in enumerate(ranks):
        node = launch.Node(rank, len(ranks), addr)
        facts = unit_facts(prof, rank=rank, nnodes=len(ranks), rank0_address=ranks[0].address)
        # The server is one worker of the gateway: rank 0's URL, the only one serving HTTP.
        gateway = gateway_plan(host, facts) if rank == 0 else None
        out[host.name] = Placement(launch.build(prof, node), facts, gateway)
    return out


def role_hosts(
    prof: Profile,
    selected: list[inventory_mod.InventoryHost],
    inventory: Path,
    limit: str | None,
) -> list[inventory_mod.InventoryHost]:
    """The selected hosts a profile serves: a prefill or decode profile the hosts of its
    inventory group; any other profile, hosts of neither group. A host of a PD fleet never runs a
    profile without its role (InputError)."""
    pd = prof.disaggregation
    if pd is None:
        stray = next((h for h in selected if h.pd_role), None)
        if stray is not None:
            raise InputError(
                f"{stray.name} is in the inventory group {stray.pd_role}: it serves a prefill/decode fleet, "
                f"and {prof.name} has no disaggregation section; deploy a profile with disaggregation.mode "
                f"{stray.pd_role} there, or leave the host out (--limit)"
            )
        return selected
    mine = [h for h in selected if h.pd_role == pd.mode]
    if selected and not mine:
        where = f"{inventory}" + (f" with --limit {limit}" if limit else "")
        raise InputError(
            f"{prof.name} is a {pd.mode} profile, and no host of {where} is in the inventory group "
            f"{pd.mode}: put the {pd.mode} servers' hosts in a group of that name (docs/pd.md)"
        )
    return mine


def gateway_plan(
    host: inventory_mod.InventoryHost, facts: UnitFacts, pd: Disaggregation | None = None
) -> GatewayPlan | None:
    """The host's gateway from its inventory variables, or None when it has none."""
    if not host.gateway_url:
        return None
    address = f"[{host.address}]" if ":" in host.address else host.address
    return GatewayPlan(
        url=host.gateway_url.rstrip("/"),
        worker_url=host.gateway_worker_url or f"http://{address}:{facts.port}",
        server_url=facts.health_url.removesuffix("/health"),
        role=pd.mode if pd else "",
        bootstrap_port=pd.bootstrap_port if pd and pd.mode == "prefill" else 0,
    )


def health_url(port: int, host: str) -> str:
    """/health as seen from the host itself: a wildcard bind is reached on loopback."""
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in target:
        target = f"[{target}]"
    return f"http://{target}:{port}/health"


def unit_facts(prof: Profile, *, rank: int = 0, nnodes: int = 1, rank0_address: str = "") -> UnitFacts:
    """The facts of a profile's unit on one host (a multi-node rank: its share of the GPUs, and
    rank 0's /health, the server's only HTTP endpoint). The GPUs are server.gpus, or the first
    ones (SGLang's GPU 0 to N-1 without CUDA_VISIBLE_DEVICES)."""
    s = prof.server
    return UnitFacts(
        profile=prof.name,
        port=s.port,
        bind=s.host,
        gpus=launch.gpu_set(prof, nnodes),
        health_url=health_url(s.port, rank0_address if nnodes > 1 else s.host),
        rank=rank,
        nnodes=nnodes,
        speculative=prof.speculative.algorithm is not None,
        model=s.model_path,
        adaptive_config=launch.adaptive_config(prof) or "",
        pd=pd_facts(prof),
    )


def pd_facts(prof: Profile) -> dict[str, Any] | None:
    pd = prof.disaggregation
    if pd is None:
        return None
    return {"role": pd.mode, "bootstrap_port": pd.bootstrap_port, "transfer_backend": pd.transfer_backend}


def preflight_checks(prof: Profile, plan: Plan, gpus: list[int], kill_holders: bool) -> PreflightChecks:
    s, spec = prof.server, prof.speculative
    return PreflightChecks(
        python=s.python,
        sglang_version=s.sglang_version,
        # As the help spells them: SGLang accepts an abbreviation (`--max-running=8`), a host's help
        # lists the whole name.
        flags=sglang_flags.spelled_flags(s.sglang_version, plan.argv[3:]),
        model_path=s.model_path,
        draft_model_path=spec.draft_model_path or "",
        algorithm=spec.algorithm or "",
        gpus=gpus,
        port=s.port,
        skip_flags_if_digest=plan.digest,
        allow_gpu_holders=kill_holders,
        unit_content=plan.unit,
        user=prof.service.user,
        cache_dir=f"{launch.CACHE_ROOT}/{launch.cache_directory(prof)}"
        if launch.cache_directory(prof)
        else "",
        memory=memory_settings(prof),
        pd=_pd_checks(prof.disaggregation),
        **_runtime_checks(prof, plan),
    )


def _pd_checks(pd: Disaggregation | None) -> dict[str, Any]:
    """PreflightChecks.pd: the role's transfer backend, its bootstrap port (a prefill server's) and
    each IB device ib_device names, as SGLang reads it: a comma list, or a JSON object of each
    GPU's comma list. A path to such a JSON file is read on the host at start: none here."""
    if pd is None:
        return {}
    text = (pd.ib_device or "").strip()
    groups = [text]
    if text.startswith("{"):
        try:
            mapping = json.loads(text)
        except ValueError:
            mapping = None  # SGLang refuses it; its pieces are named missing on the host
        if isinstance(mapping, dict):
            groups = [str(value) for value in mapping.values()]
    elif text.endswith(".json"):
        groups = []
    devices = [d.strip() for group in groups for d in group.split(",") if d.strip()]
    return {
        "transfer_backend": pd.transfer_backend,
        "bootstrap_port": pd.bootstrap_port if pd.mode == "prefill" else 0,
        "ib_devices": list(dict.fromkeys(devices)),
    }


def memory_settings(prof: Profile) -> dict[str, Any]:
    """What the GPU memory fit on the host needs to know of the server (module_utils memfit's
    `server`): its parallel layout, the static fraction, the KV cache and graph settings, and the
    speculative decoding it drafts with. Flags only in extra_args are read as SGLang reads them."""
    s, spec = prof.server, prof.speculative
    extra = sglang_flags.option_values(s.sglang_version, s.extra_args)
    speculative = None
    if spec.algorithm:
        speculative = {
            "algorithm": spec.algorithm,
            "num_steps": spec.num_steps,
            "eagle_topk": spec.eagle_topk,
            "num_draft_tokens": spec.num_draft_tokens,
        }
    running = extra.get("--max-running-requests")

    def number(flag: str) -> int | None:
        value = extra.get(flag)
        return int(value) if value is not None else None

    return {
        "sglang_version": s.sglang_version,
        "tp_size": s.tp_size,
        "pp_size": int(extra.get("--pp-size") or 1),
        "dp_size": s.dp_size,
        "ep_size": int(extra.get("--ep-size") or 1),
        "enable_dp_attention": bool(extra.get("--enable-dp-attention")),
        "mem_fraction_static": s.mem_fraction_static,
        "context_length": s.context_length,
        "kv_cache_dtype": str(extra.get("--kv-cache-dtype") or "auto"),
        "cuda_graph": s.cuda_graph,
        "cuda_graph_max_bs": s.cuda_graph_max_bs,
        "max_running_requests": int(running) if running is not None else None,
        "chunked_prefill_size": number("--chunked-prefill-size"),
        "max_total_tokens": number("--max-total-tokens"),
        "page_size": number("--page-size"),
        "quantization": str(extra.get("--quantization") or ""),
        "speculative": speculative,
    }


def _runtime_checks(prof: Profile, plan: Plan) -> dict[str, Any]:
    """PreflightChecks' engine, image, pull, mounts and run command of a container runtime; none
    on the host."""
    rt = prof.runtime
    if not rt.container:
        return {}
    return {
        "engine": rt.kind,
        "image": str(rt.image),
        "pull": rt.pull,
        "mounts": [m.source for m in rt.mounts],
        "run_options": container_unit.probe_options(prof),
        "run_words": run_words(plan),
        "secret_files": [path for path in (plan.secret_path, plan.env_file_path, plan.adaptive_path) if path],
    }


def run_words(plan: Plan) -> list[str]:
    """The words of the unit's `ENGINE run` after the verb, as systemd hands them over: the words
    it expands, ${CREDENTIALS_DIRECTORY}/..., expanded (launch.credentials_dir)."""
    return [*plan.engine_argv, *plan.started_argv()][2:]


def lock(
    run_id: str, profile: str, ttl_s: float, wait_s: float, *, keep: bool = False, detached: bool = False
) -> LockSpec:
    """This run's lock. `detached` (a plan a later ansible-playbook runs): no process of this
    machine is named, since the one making it is gone by then, so no deploy takes it over as a dead
    run's and the run waits for a live deploy's own; it is stale only once its TTL ran out."""
    where = f"{getpass.getuser()}@{socket.gethostname()}"
    return LockSpec(
        holder=f"{where} (orchestrator plan, run {run_id})" if detached else f"{where} (pid {os.getpid()})",
        run_id=run_id,
        profile=profile,
        ttl_s=ttl_s,
        wait_s=wait_s,
        control="" if detached else socket.gethostname(),
        pid=0 if detached else os.getpid(),
        live_pids=[] if detached else _live_pids(),
        keep=keep,
    )


def _live_pids() -> list[int]:
    """PIDs running on this machine: a lock taken from here by any other PID belongs to a
    deploy that died (killed, crashed) and may be taken over."""
    return sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())


def for_profile(
    prof: Profile, plan: Plan, facts: UnitFacts, *, preflight: bool = True, **run: Any
) -> HostPlan:
    """One host's plan for a profile; `run` holds the run's own fields (lock, force_restart,
    kill_gpu_holders)."""
    checks = preflight_checks(prof, plan, facts.gpus, run.get("kill_gpu_holders", False))
    return HostPlan(
        unit_name=plan.unit_name,
        profile=plan.profile,
        unit=plan.unit,
        digest=plan.digest,
        facts=facts,
        secret_path=plan.secret_path or "",
        env_file_path=plan.env_file_path or "",
        adaptive_path=plan.adaptive_path or "",
        service_user=plan.user,
        preflight=checks if preflight else None,
        health_timeout_s=prof.service.health_timeout_s,
        health_interval_s=prof.service.health_poll_interval_s,
        lockstep=facts.nnodes > 1,
        **run,
    )


def for_record(unit_name: str, record: dict[str, Any], **run: Any) -> HostPlan:
    """A recorded healthy unit (rollback), with the facts recorded beside it: its adaptive config
    too, which the unit's text only shows."""
    facts = UnitFacts.model_validate(record["facts"])
    return HostPlan(
        unit_name=unit_name,
        profile=record["profile"],
        unit=record["unit"],
        digest=record["digest"],
        facts=facts,
        adaptive_path=launch.adaptive_path(unit_name) if facts.adaptive_config else "",
        trusted_digest=record["digest"],
        lockstep=facts.nnodes > 1,
        **run,
    )
