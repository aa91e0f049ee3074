"""A container runtime's part of the unit: the engine's commands and the [Service] settings they need.

launch.py builds SGLang's argv and environment the same way for every runtime. For
`runtime.kind: docker` or `podman`, this module wraps them in the engine's `run` command. So the
words after the image are exactly the host runtime's argv. Every engine option is one word
(`--name=value`). That keeps the image the first word that does not start with '-'. It is how
launch.parse_unit finds SGLang's argv in a deployed unit again.

podman: systemd supervises the container itself, through Podman's own systemd integration. The unit
is as `podman generate systemd --new` (4.3.1) and Quadlet (4.4 on) write it:
- Type=notify with NotifyAccess=all and `--sdnotify=conmon`. conmon becomes MainPID, and says READY
  once the container runs.
- `-d`, so no CLI client is left to die on its own.
- From Quadlet, `--cgroups=split` with Delegate=yes. It keeps the container under the unit's
  cgroup, where systemd's stop and kill reach it. podman-run(1) says it "splits the current CGroup
  in two sub-cgroups: one for conmon and one for the container payload".
- From Quadlet too, KillMode=mixed, which lets conmon clean up.
- From Quadlet too, `--log-driver=passthrough`. The container's output is then the unit's, in its
  journal.

This needs podman 4.3 or later. Debian bookworm ships 4.3.1. Its podman-run(1) documents each of
these, and the tests run its CLI. Older ones are not tried.

docker: the daemon, not systemd, parents the container. So the unit runs `docker run` in the
foreground:
- Its output is the unit's journal.
- It ends with the container's exit code, so a container that dies fails the unit.
- ExecStop stops the container. systemd runs it also when the client died on its own.
- ExecStartPre removes a container left behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.profile import container_rules
from orchestrator.profile.model import Profile

ENGINES = {"docker": "/usr/bin/docker", "podman": "/usr/bin/podman"}
#: The label that names the unit a container belongs to: GPU ownership
#: (orchestrator_host/containers.py labelled_containers) and verify read it.
LABEL = "orchestrator.unit"
#: Seconds systemd allows past the engine's own stop timeout before it kills the stop command:
#: `podman generate systemd` gives 60 (TimeoutStopSec=70 for the default -t 10).
STOP_MARGIN_S = 60


@dataclass(frozen=True)
class Service:
    """The [Service] settings and commands that depend on the runtime (argv lists; launch.py quotes
    them); the defaults are the host runtime's."""

    #: The engine's `run` up to and including the image; empty on the host.
    run: list[str] = field(default_factory=list)
    type: str = "exec"
    notify_access: str | None = None
    delegate: bool = False
    kill_mode: str = "control-group"
    start_pre: list[list[str]] = field(default_factory=list)
    stop: list[list[str]] = field(default_factory=list)
    stop_post: list[list[str]] = field(default_factory=list)
    #: Seconds TimeoutStopSec= adds to service.stop_timeout_s.
    stop_margin_s: int = 0
    success_exit_status: str | None = None
    #: What the unit's header comment says about the runtime.
    note: str = ""


#: A container stopped with SIGTERM exits 143 (128 + 15) where a host process is killed by the
#: signal, which systemd counts as clean; without this, every stop would leave the unit failed.
SIGTERM_EXIT = "143"


def name(profile: Profile) -> str:
    """The container's name: the unit's stem (validated as a container name)."""
    return profile.service.unit_name.removesuffix(".service")


def service(
    profile: Profile,
    *,
    gpus: list[int],
    environment: dict[str, str],
    mounts: list[tuple[str, str, bool]],
    env_file: str | None,
) -> Service:
    """The engine's commands for this profile; `mounts` are (source, target, read_only), model,
    drafter and credential first; `environment` reaches the container as --env words."""
    rt = profile.runtime
    engine, ctr = ENGINES[rt.kind], name(profile)
    timeout = str(profile.service.stop_timeout_s)
    run = [engine, "run", "--rm"]
    if rt.kind == "podman":
        run += ["--replace", "-d", "--sdnotify=conmon", f"--cgroups={rt.cgroups}", "--log-driver=passthrough"]
    run += [f"--name={ctr}", f"--label={LABEL}={profile.service.unit_name}", f"--pull={rt.pull}"]
    run += ["--network=host", *(["--ipc=host"] if rt.ipc_host else [])]
    run += [f"--shm-size={rt.shm_size}"] if rt.shm_size else []
    run += _gpus(rt.gpu_request, gpus)
    run += _ulimits(profile)
    run += [f"--volume={src}:{dst}{':ro' if ro else ''}" for src, dst, ro in mounts]
    run += [f"--env={k}={v}" for k, v in environment.items()]
    run += [f"--env-file={env_file}"] if env_file else []
    run += [*rt.options, str(rt.image)]
    if rt.kind == "podman":
        return Service(
            run=run,
            type="notify",
            notify_access="all",
            delegate=rt.cgroups == "split",  # only split makes sub-cgroups
            kill_mode="mixed",
            stop=[[engine, "stop", "--ignore", "-t", timeout, ctr]],
            stop_post=[["-" + engine, "rm", "-f", "--ignore", ctr]],
            stop_margin_s=STOP_MARGIN_S,
            success_exit_status=SIGTERM_EXIT,
            note=f"podman: podman 4.3 or later (--sdnotify=conmon, --cgroups={rt.cgroups}, "
            "--log-driver=passthrough)",
        )
    return Service(
        run=run,
        start_pre=[["-" + engine, "rm", "-f", ctr]],
        # `-`: the container is gone already when it ended on its own (--rm).
        stop=[["-" + engine, "stop", "-t", timeout, ctr]],
        stop_margin_s=STOP_MARGIN_S,
        success_exit_status=SIGTERM_EXIT,
        note="docker: docker run in the foreground (the container's exit code is the unit's)",
    )


def probe_options(profile: Profile) -> list[str]:
    """The unit's engine options that a throw-away container of the image (preflight's SGLang
    version and --help) needs on the same host: its network, podman's cgroups, the ulimits and
    runtime.options. A host may refuse a container the defaults (a systemd-nspawn host: a new
    network namespace, cgroups, a nofile above its hard limit), and what the unit can run, these
    can. No GPUs, mounts, environment or name."""
    rt = profile.runtime
    cgroups = [f"--cgroups={rt.cgroups}"] if rt.kind == "podman" else []
    return ["--network=host", *cgroups, *_ulimits(profile), *rt.options]


def _ulimits(profile: Profile) -> list[str]:
    limits = profile.service.limits
    words = []
    for limit, value in (("memlock", limits.memlock), ("nofile", limits.nofile)):
        value = container_rules.ulimit_value(value)
        words.append(f"--ulimit={limit}={value}:{value}")
    return words


def _gpus(request: str, gpus: list[int]) -> list[str]:
    """Docker's --gpus (its value is CSV, hence the quotes around a list) or one CDI device per
    GPU (podman's way, and docker's with runtime.gpu_devices cdi). Inside the container they are
    GPU 0 to N-1: no CUDA_VISIBLE_DEVICES."""
    if request == "gpus":
        return [f'--gpus="device={",".join(map(str, gpus))}"']
    return [f"--device=nvidia.com/gpu={gpu}" for gpu in gpus]
