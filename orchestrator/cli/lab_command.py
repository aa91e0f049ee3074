"""`orchestrator lab ...`: the thin CLI over `orchestrator.lab.nspawn` and `orchestrator.lab.gateway`.

It is the only lab code that prints.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.cli import params
from orchestrator.cli.console import state_dir_problem
from orchestrator.errors import InputError, OrchestratorError
from orchestrator.lab import gateway as lab_gateway
from orchestrator.lab import nspawn

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _errors_to_exit(command: Callable[..., Any]) -> Callable[..., Any]:
    """Expected failures become `error: ...` on stderr and the error's exit code, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except OrchestratorError as error:
            err.print(Text(f"error: {error}", style="red"))
            raise SystemExit(error.exit_code) from None
        except OSError as exc:  # the state directory (a file, read-only): one line, as every command
            problem = state_dir_problem(exc)
            if problem is None:
                raise
            err.print(Text(f"error: {problem}", style="red"))
            raise SystemExit(problem.exit_code) from None

    return wrapper


def _progress(line: str) -> None:
    err.print(Text(line, style="dim"))


@click.group()
def lab() -> None:
    """Local lab: Debian hosts in systemd-nspawn containers, reached by SSH like real GPU hosts."""


@lab.command()
@click.option(
    "--hosts", default=nspawn.DEFAULT_HOSTS, show_default=True, type=params.Integer(1, nspawn.MAX_HOSTS)
)
@click.option(
    "--gpus", default=8, show_default=True, type=params.Integer(1, 64), help="Stand-in GPUs per host."
)
@click.option("--sglang-version", default="0.5.9", show_default=True, help="SGLang stand-in version.")
@click.option(
    "--podman",
    is_flag=True,
    help="Hosts also carry Debian's podman, a CDI spec for the stand-in GPUs and the stand-in's image "
    "(localhost/sglang-standin:VERSION), for runtime.kind podman profiles. Slower to build. Not with "
    "--docker.",
)
@click.option(
    "--docker",
    is_flag=True,
    help="Debian trixie hosts with its docker (26.1: CDI) running, the CDI spec and the stand-in's image, "
    "for runtime.kind docker profiles (runtime.gpu_devices: cdi). The hosts get CAP_NET_ADMIN, the "
    "keyring and bpf system calls, and cgroup v2. Not with --podman.",
)
@_errors_to_exit
def up(hosts: int, gpus: int, sglang_version: str, podman: bool, docker: bool) -> None:
    """Start the lab hosts (a no-op when the same lab is already up)."""
    state = nspawn.up(
        hosts=hosts,
        gpus=gpus,
        sglang_version=sglang_version,
        progress=_progress,
        podman=podman,
        docker=docker,
    )
    for host in state.hosts:
        failed = f"  failed units: {', '.join(host.failed_units)}" if host.failed_units else ""
        out.print(f"{host.name}  {host.address}  {host.systemd_state}{failed}")
    if state.image:
        out.print(f"\nimage:     {state.image}")
    out.print(f"\ninventory: {state.inventory}")
    out.print(f"as sudoer: {state.sudo_inventory}")
    out.print(f"become password (deploy-pw, -K): {state.become_password_file}")
    out.print(f"try:       ansible all -i {state.inventory} -m ping")
    key, known, first = state.private_key, state.known_hosts, state.hosts[0]
    out.print(f"           ssh -i {key} -o UserKnownHostsFile={known} root@{first.address}")
    out.print(f"           ssh -i {state.user_key} -o UserKnownHostsFile={known} deploy@{first.address}")


@lab.command()
@_errors_to_exit
def status() -> None:
    """Show each lab host: process, systemd state, SSH. Exit 1 unless all are healthy."""
    seen = nspawn.status()
    if not seen.exists:
        out.print("no lab; start one with `lab up`")
        raise SystemExit(1)
    table = Table("host", "address", "nspawn pid", "systemd", "ssh")
    for host in seen.hosts:
        alive = f"{host.pid} up" if host.alive else f"{host.pid} [red]dead[/]"
        ssh = "[green]ok[/]" if host.ssh else "[red]no[/]"
        table.add_row(host.name, host.address, alive, host.systemd_state, ssh)
    out.print(table)
    if not seen.complete:
        out.print("[yellow]lab up did not finish; run `lab up` again or `lab down`[/]")
    if seen.inventory:
        out.print(f"inventory: {seen.inventory}")
    if seen.sudo_inventory:
        out.print(f"as sudoer: {seen.sudo_inventory}")
    if seen.podman:
        out.print("podman:    yes (lab up --podman)")
    if seen.docker:
        out.print("docker:    yes (lab up --docker)")
    if seen.bastion:
        out.print(f"bastion:   {seen.bastion} (the others refuse ssh from here; `lab bastion --off`)")
    if not seen.healthy:
        raise SystemExit(1)


@lab.command()
@click.argument("jump", required=False)
@click.option("--off", is_flag=True, help="Let every host answer ssh from this machine again.")
@_errors_to_exit
def bastion(jump: str | None, off: bool) -> None:
    """Make host JUMP the jump host: the other hosts refuse ssh from this machine (reach them with
    ssh -J root@JUMP, or ProxyJump in ansible.cfg's ssh_args) until `lab bastion --off` or `lab up`."""
    if off:
        out.print("every host answers ssh again" if nspawn.lift_bastion() else "no bastion was set")
        return
    if not jump:
        raise click.UsageError("name the jump host (lab1, ...), or give --off")
    behind = nspawn.bastion(jump)
    out.print(f"{jump} is the jump host; {', '.join(behind) or 'no other host'} refuse ssh from this machine")


@lab.command()
@_errors_to_exit
def down() -> None:
    """Stop the lab hosts and remove everything `lab up` made (the base root cache stays)."""
    nspawn.down(progress=_progress)


@lab.group()
def gateway() -> None:
    """SGLang's gateway (smg) on this machine's loopback, routing to the lab hosts' servers."""


@gateway.command("up")
@click.option("--port", default=lab_gateway.DEFAULT_PORT, show_default=True, type=params.Integer(1, 65534))
@click.option(
    "--worker-port",
    default=lab_gateway.WORKER_PORT,
    show_default=True,
    type=params.Integer(1, 65535),
    help="The port the hosts' servers listen on.",
)
@click.option(
    "--smg",
    "smg",
    metavar="PROGRAM",
    default=None,
    help="The smg to run (a path, or a name on PATH). Default: `smg` on PATH, smg 1.x of the "
    "gateway extra; e.g. a venv's bin/smg of sglang-router 0.3.2.",
)
@click.option(
    "--prefill",
    metavar="HOST[,HOST...]",
    help="A prefill/decode fleet: these lab hosts serve prefill (smg in PD mode; give --decode too).",
)
@click.option(
    "--decode", metavar="HOST[,HOST...]", help="A prefill/decode fleet: these lab hosts serve decode."
)
@click.option(
    "--bootstrap-port",
    default=8998,
    show_default=True,
    type=params.Integer(1, 65535),
    help="The prefill servers' bootstrap port (disaggregation.bootstrap_port).",
)
@click.option(
    "--health-interval",
    type=params.Integer(1, 3600),
    help="Seconds between smg's health checks of each worker (2 misses mark it failed). Default: smg's 60.",
)
@_errors_to_exit
def gateway_up(
    port: int,
    worker_port: int,
    smg: str | None,
    prefill: str | None,
    decode: str | None,
    bootstrap_port: int,
    health_interval: int | None,
) -> None:
    """Start smg with every lab host as a worker and wait until all serve (a no-op when it runs).

    With --prefill and --decode: smg in PD mode in front of a prefill/decode fleet (docs/pd.md).
    It waits for the router only; deploy the fleet through inventory-gateway.yml.
    """
    pd = None
    if (prefill is None) != (decode is None):
        raise InputError("a prefill/decode fleet takes both --prefill and --decode")
    if prefill is not None and decode is not None:
        pd = lab_gateway.PdSplit(_names(prefill), _names(decode), bootstrap_port)
    state = lab_gateway.up(
        port=port, worker_port=worker_port, smg=smg, pd=pd, health_interval_s=health_interval
    )
    if state.reused:
        _progress("gateway already up with these workers; nothing to do")
    out.print(f"gateway:   {state.url}  (pid {state.pid}, log {state.log})")
    out.print(f"workers:   {' '.join(state.workers)}")
    out.print(f"inventory: {state.inventory}  (deploys through it drain each host at the gateway first)")


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


@gateway.command("down")
@_errors_to_exit
def gateway_down() -> None:
    """Stop the gateway and remove its record and inventory."""
    out.print("gateway stopped" if lab_gateway.down() else "no gateway was running")


@gateway.command("status")
@_errors_to_exit
def gateway_status() -> None:
    """Show the gateway and each worker's health as smg sees it. Exit 1 when it is not running."""
    state = lab_gateway.state()
    if state is None:
        out.print("no gateway; start one with `lab gateway up`")
        raise SystemExit(1)
    out.print(f"gateway:   {state.url}  (pid {state.pid}, log {state.log})")
    table = Table("worker", "healthy")
    for worker in lab_gateway.worker_health(state):
        healthy = {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]not registered[/]"}
        table.add_row(worker.url, healthy[worker.healthy])
    out.print(table)
    out.print(f"inventory: {state.inventory}")
