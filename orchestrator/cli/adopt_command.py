"""adopt: take over an SGLang server started by hand, with the flags it runs today.

It finds the server on each host, writes a profile that renders to the same command, proves it,
and with --take-over restarts it under the tool's unit.
"""

from __future__ import annotations

import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from orchestrator.cli import console, params
from orchestrator.cli.console import err, handle_errors, inventory_or_running_lab, out, plain, shown
from orchestrator.errors import InputError
from orchestrator.profile import model as profile_mod

#: Exit codes: a difference that changes what the server does, or a host that failed.
CHANGES = 1


@click.command()
@console.inventory_option("the local lab that is up (adopt never brings one up)")
@console.limit_option()
@click.option("--port", type=params.Integer(1, 65535), help="The server listening on this port.")
@click.option("--pid", type=params.Integer(1, 2**22), help="This process (with --limit to one host).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The profile file to write (default: PROFILES/NAME.yml); never over an existing file.",
)
@click.option("--name", default="adopted", show_default=True, help="The profile's name (without -o).")
@click.option(
    "--unit-name",
    default="sglang.service",
    show_default=True,
    help="The systemd unit the take-over runs the server under.",
)
@click.option("--check", is_flag=True, help="Find, map and prove; write nothing and change nothing.")
@click.option(
    "--take-over",
    is_flag=True,
    help="Then deploy the profile: stop the hand-started server and start the same command under "
    "the unit (the hand command starts again if the unit fails).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def adopt(
    inventory: Path | None,
    limit: str | None,
    port: int | None,
    pid: int | None,
    output: Path | None,
    name: str,
    unit_name: str,
    check: bool,
    take_over: bool,
    as_json: bool,
) -> None:
    """Write a profile for the SGLang server a team started by hand, and prove it renders the same.

    The server is found by --port, by --pid, or as the one SGLang server of each host. Its argv and
    environment come from /proc (or the container engine). Each flag maps back to the profile
    field that renders it for the host's SGLang version; what the profile has no field for goes to
    extra_args. Secrets never reach the profile or the terminal. The profile's render is compared
    word for word with the live command: a difference that changes what SGLang does exits 1.
    """
    from orchestrator import ledger
    from orchestrator.hosts import adopt_play
    from orchestrator.render import reverse

    if check and take_over:
        raise InputError("--check changes nothing and --take-over restarts the server: give one of them")
    path = _output(output, name)
    name = path.stem
    inv = inventory_or_running_lab(inventory)
    found = adopt_play.find(inv, limit=limit, port=port or 0, pid=pid or 0)
    chosen, problems = adopt_play.choose(found, port=port, pid=pid, unit_name=unit_name)
    adoptions = {
        host: reverse.adopt(
            adopt_play.live(host, seen, found[host].systemd_path),
            name=name,
            version=found[host].sglang_version,
            unit_name=unit_name,
        )
        for host, seen in chosen.items()
    }
    for host, a in adoptions.items():
        problems += [f"{host}: {p}" for p in a.problems]
    data, fleet = adopt_play.one_profile(adoptions, {h: s.secrets for h, s in chosen.items()})
    problems += fleet
    result: dict[str, Any] = {
        "servers": {h: _shown_server(s) for h, s in chosen.items()},
        "problems": problems,
        "profile": data,
    }
    if not as_json:
        _show_found(chosen)
    if problems or not chosen:
        if not chosen and not problems:
            problems = ["no SGLang server found" + (f" listening on port {port}" if port else "")]
        _finish(result, as_json, problems, exit_code=2)
    prof = _validated(data, path)
    differences = {
        host: reverse.compare(
            prof, adopt_play.live(host, chosen[host], found[host].systemd_path), found[host].sglang_version
        )
        for host in chosen
    }
    first = next(iter(adoptions.values()))
    first.notes.extend(_pinned(chosen))
    result.update(
        differences={h: [d.__dict__ for d in ds] for h, ds in differences.items()},
        left_out=first.left_out,
        notes=first.notes,
        secret_files=first.secret_files,
    )
    changing = [f"{h}: {d.what}: {d.reason}" for h, ds in differences.items() for d in ds if not d.harmless]
    if not as_json:
        _show_mapping(first, differences)
    if changing:
        _finish(
            result, as_json, [*changing, "the profile would run something else: nothing written"], CHANGES
        )
    wrong = [
        f"{h}: {line}" for h, s in chosen.items() for line in adopt_play.secret_mismatches(prof, s.secrets)
    ]
    if wrong:
        _finish(result, as_json, [*wrong, "nothing written"], 2)
    if check:
        result["written"] = ""
        _finish(result, as_json, [], 0)
    missing = [f for f in first.secret_files.values() if not Path(f).expanduser().is_file()]
    if take_over and missing:  # before anything is written: the same command runs again once they exist
        lines = [
            f"create {f} (mode 0600) with the value the server runs with, then run again" for f in missing
        ]
        _finish(result, as_json, [*lines, "nothing written: the take-over needs every secret"], 2)
    # A server another unit runs is stopped by that unit's owner, never signalled by a take-over.
    owned = {h: s.launcher.detail for h, s in chosen.items() if s.launcher.kind == "unit"}
    if take_over and owned:
        lines = [
            f"{h}: PID {chosen[h].pid} runs in {u}: stop it first (systemctl disable --now {u})"
            for h, u in owned.items()
        ]
        _finish(result, as_json, [*lines, "nothing written"], 2)
    ledger.ready()  # the adoption is recorded with the file: neither without the other
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x") as fh:
        fh.write(_header(chosen) + adopt_play.dump(data))
    result["written"] = str(path)
    adopt_play.record({h: s for h, s in chosen.items() if h not in owned}, prof)
    if not as_json:
        out.print(f"wrote {shown(str(path))}: deploy it, or `adopt --take-over`, to run it under the unit")
        for secret, where in first.secret_files.items():
            out.print(
                f"create {shown(where)} (mode 0600) holding {shown(secret)}: the profile reads it there"
            )
        for host, unit in owned.items():
            out.print(
                f"{shown(host)}: runs in {shown(unit)}, not started by hand: stop and disable that unit "
                "before you deploy the profile"
            )
    if not take_over:
        _finish(result, as_json, [], 0)
    _take_over(prof, inv, list(chosen), as_json)


def _pinned(chosen: dict[str, Any]) -> list[str]:
    """A note per server bound to some CPUs or memory nodes (taskset, numactl: they leave no word
    on argv): the unit runs unbound unless the profile says so."""
    notes = []
    for host, s in chosen.items():
        if s.cpus_allowed:
            notes.append(
                f"{host}: PID {s.pid} runs on CPUs {s.cpus_allowed} only (taskset or numactl): the unit "
                f"runs on every CPU; add service.extra: {{CPUAffinity: '{s.cpus_allowed}'}} to keep it"
            )
        if s.mems_allowed:
            notes.append(
                f"{host}: PID {s.pid} uses memory nodes {s.mems_allowed} only: add service.extra: "
                f"{{NUMAPolicy: bind, NUMAMask: '{s.mems_allowed}'}} to keep it"
            )
    return notes


def _shown_server(s: Any) -> dict[str, Any]:
    """A found server as --json shows it: its secrets by name only (never their sha256)."""
    data = s.model_dump()
    data["secrets"] = sorted(data["secrets"])
    return data


def _output(output: Path | None, name: str) -> Path:
    """The file to write, refused before any play when it exists or its name is no profile name."""
    if output is None:
        if not profile_mod.NAME_RE.fullmatch(name):
            raise InputError(f"--name {name!r} is not a profile name: use {profile_mod.NAME_RULE}")
        folder, _ = profile_mod.profiles_dir()
        output = folder / f"{name}.yml"
    elif not profile_mod.NAME_RE.fullmatch(output.stem):
        raise InputError(
            f"--output {output}: {output.stem!r} is not a profile name: use {profile_mod.NAME_RULE}"
        )
    if output.suffix not in (".yml", ".yaml"):
        raise InputError(f"--output {output}: a profile file ends in .yml")
    if output.exists():
        raise InputError(f"{output} exists: remove it, or name another file with -o")
    return output


def _validated(data: dict[str, Any], path: Path) -> profile_mod.Profile:
    """The adopted profile, validated as any profile file is (from a temporary copy beside the
    real one's place, so its name and relative references read the same)."""
    from orchestrator.hosts import adopt_play

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / path.name
        copy.write_text(adopt_play.dump(data))
        return profile_mod.load(str(copy))


def _header(chosen: dict[str, Any]) -> str:
    when = datetime.datetime.now().isoformat(timespec="seconds")
    hosts = ", ".join(f"{h} PID {s.pid}" for h, s in chosen.items())
    return f"# written by `orchestrator adopt` at {when}, from {hosts}\n"


def _show_found(chosen: dict[str, Any]) -> None:
    table = Table(title="found", title_justify="left")
    for column in ("host", "PID", "user", "started", "GPUs", "port", "started by", "log"):
        table.add_column(column)
    for host, s in chosen.items():
        started = datetime.datetime.fromtimestamp(s.started).isoformat(sep=" ", timespec="seconds")
        launcher, detail = s.launcher.kind, s.launcher.detail
        table.add_row(
            plain(host),
            str(s.pid),
            plain(s.user),
            started,
            ",".join(map(str, s.gpus)) or "-",
            ",".join(map(str, s.ports)) or "-",
            plain(f"{launcher} ({detail})" if detail else launcher),
            plain(s.log or "-"),
        )
    out.print(table)


def _show_mapping(first: Any, differences: dict[str, list[Any]]) -> None:
    for name, why in sorted(first.left_out.items()):
        out.print(f"left out {shown(name)}: {shown(why)}")
    for note in first.notes:
        out.print(f"note: {shown(note)}")
    for host, ds in differences.items():
        if not ds:
            out.print(f"{shown(host)}: the profile renders the live argv and environment word for word")
        for d in ds:
            sign = "same for SGLang" if d.harmless else "DIFFERS"
            out.print(f"{shown(host)}: {sign}: {shown(d.what)}: {shown(d.reason)}")


def _finish(result: dict[str, Any], as_json: bool, problems: list[str], exit_code: int) -> None:
    if as_json:
        click.echo(json.dumps({**result, "problems": problems or result.get("problems", [])}, indent=2))
    else:
        for line in problems:
            err.print(shown(line), style="red")
    sys.exit(exit_code)


def _take_over(prof: profile_mod.Profile, inv: Path, hosts: list[str], as_json: bool) -> None:
    """Deploy the adopted profile on the hosts it came from: the recorded hand-started server is
    stopped first, and started again as it was if the unit fails."""
    from orchestrator.cli import view
    from orchestrator.hosts import deploy as deploy_mod

    options = deploy_mod.Options(limit=",".join(hosts))
    view.show_deploy(
        lambda on_event: deploy_mod.deploy(prof, inv, options, on_event), f"take over -> {prof.name}", as_json
    )
