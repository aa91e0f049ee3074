"""The commands on profiles alone, which touch no host: validate, render, profiles, schema."""

from __future__ import annotations

import json

import click
from rich.table import Table

from orchestrator.cli.console import (
    handle_errors,
    out,
    plain,
    shown,
)
from orchestrator.errors import InputError, Problem, ProfileError
from orchestrator.paths import EXAMPLES_DIR
from orchestrator.profile import json_schema, sglang_flags
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch, systemd_check

profile_option = click.option(
    "--profile",
    "-p",
    "profile_ref",
    metavar="NAME|PATH",
    help="Profile name from the profiles folder, example:NAME, or a YAML file.",
)


@click.command()
@profile_option
@handle_errors
def validate(profile_ref: str | None) -> None:
    """Validate one profile, or every profile `profiles` lists when none is given."""
    refs = [profile_ref] if profile_ref is not None else list(profile_mod.every())
    problems = []
    skipped = ""
    for ref in refs:
        try:
            prof = profile_mod.load(ref)
            plan = launch.build(prof)
            verdict = systemd_check.require(prof, [plan])  # systemd's own reading, where it is here
        except InputError as exc:  # ProfileError, or a file that does not load (bad YAML)
            problems += exc.problems if isinstance(exc, ProfileError) else [Problem("error", "", str(exc))]
            continue
        skipped = verdict.skipped
        label = ref if ref.startswith(profile_mod.EXAMPLE) else prof.name
        out.print(f"ok: {shown(label)} ({_spec_summary(prof)}, digest {plan.digest})")
        for note in profile_mod.notes(prof):
            click.echo(f"note: {shown(label)}: {shown(note)}", err=True)
    if skipped:
        click.echo(f"note: {shown(skipped)}", err=True)
    if problems:
        raise ProfileError(problems)


@click.command()
@click.option(
    "--profile", "-p", "profile_ref", metavar="NAME|PATH", required=True, help="Profile name or file."
)
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"argv": [...], "environment": {...}, "unit": "..."}.'
)
@click.option(
    "--against",
    metavar="NAME|PATH",
    help="Print only the SGLang flags and environment variables that differ from this profile's.",
)
@handle_errors
def render(profile_ref: str, as_json: bool, against: str | None) -> None:
    """Print the systemd unit the profile renders to, byte for byte what a host gets."""
    prof = profile_mod.load(profile_ref)
    notes = [sglang_flags.help_note(prof.server.sglang_version), *profile_mod.notes(prof)]
    plan = launch.build(prof)
    verdict = systemd_check.require(prof, [plan])
    if verdict.skipped:
        notes.append(verdict.skipped)
    for note in filter(None, notes):  # on stderr: stdout stays the unit's exact bytes
        click.echo(f"note: {shown(note)}", err=True)
    if against:
        other = launch.build(profile_mod.load(against))
        changes = launch.flag_changes(other.unit, plan.unit)
        if as_json:
            click.echo(json.dumps({"from": other.profile, "to": plan.profile, "changes": changes}, indent=2))
            return
        click.echo(f"{shown(other.profile)} -> {shown(plan.profile)}: {len(changes) or 'no'} change(s)")
        for line in changes:  # values as the profiles wrote them: an ESC in one is shown as \x1b
            click.echo(f"  {shown(line)}")
        return
    if as_json:
        click.echo(launch.dumps(plan))
    else:
        click.echo(plan.unit, nl=False)


def _spec_summary(prof: profile_mod.Profile) -> str:
    spec = prof.speculative
    if spec.algorithm is None:
        return "no speculation"
    if spec.adaptive is not None:
        tiers = (
            "SGLang's default tiers" if spec.adaptive.tiers is None else f"{len(spec.adaptive.tiers)} tiers"
        )
        return f"{spec.algorithm} adaptive, {tiers}"
    if spec.num_steps is None:
        return f"{spec.algorithm}, SGLang's defaults"
    tree = f"{spec.num_steps} steps x top-k {spec.eagle_topk}"
    return f"{spec.algorithm} {tree}, {spec.num_draft_tokens} draft tokens"


@click.command()
@handle_errors
def profiles() -> None:
    """List the profiles -p finds by name: the profiles folder's, then the shipped examples."""
    folder, label = profile_mod.profiles_dir()
    table = Table(
        title="profiles",
        caption=f"profiles folder: {shown(label)}{'' if folder.is_dir() else ', not found'}; "
        f"shipped examples (example:NAME): {shown(EXAMPLES_DIR)}",
        caption_justify="left",
    )
    for col in ("name", "from", "extends", "algorithm", "steps/top-k/draft", "CUDA graphs"):
        table.add_column(col, no_wrap=True)
    table.add_column("description", overflow="fold")
    problems = []
    for name in profile_mod.every():
        source = "shipped" if name.startswith(profile_mod.EXAMPLE) else "folder"
        try:
            prof = profile_mod.load(name)
        except InputError as exc:  # ProfileError, or a file that does not load (bad YAML)
            problems += exc.problems if isinstance(exc, ProfileError) else [Problem("error", "", str(exc))]
            table.add_row(shown(name), source, "", "", "", "", plain("invalid: run `validate`", "red"))
            continue
        spec = prof.speculative
        trio = "/".join(str(v) for v in (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens))
        table.add_row(
            shown(name),
            source,
            shown(prof.extends or ""),
            spec.algorithm or "-",
            trio if spec.num_steps is not None else "-",
            "on" if prof.server.cuda_graph else "off",
            shown(prof.description),
        )
    out.print(table)
    if problems:
        raise ProfileError(problems)


@click.command()
@click.argument("kind", type=click.Choice(["profile", "space"]), default="profile")
def schema(kind: str) -> None:
    """Print the JSON Schema of a profile file (or of a `tune` space file), for editors."""
    if kind == "space":
        from orchestrator.tuning import space

        click.echo(json.dumps(json_schema.of(space.Space), indent=2))
    else:
        click.echo(json.dumps(json_schema.of(profile_mod.Profile), indent=2))
