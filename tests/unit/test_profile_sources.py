"""Where a profile name is looked up (issue 15): `--profiles-dir`, else `$ORCHESTRATOR_PROFILES`, else
./profiles/; `example:NAME` is a shipped example wherever the tool is installed; `extends:` reads
names the same way; a stray file never shadows a profile."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.errors import InputError
from orchestrator.paths import EXAMPLES_DIR
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory outside the checkout, as after `pipx install`."""
    monkeypatch.delenv("ORCHESTRATOR_PROFILES", raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    profile_mod.use_profiles_dir(None)


def _folder(path: Path, **profiles: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in profiles.items():
        (path / f"{name}.yml").write_text(yaml.safe_dump(data))
    return path


def _port(data: dict) -> dict:
    return {"extends": "example:cg_5tok", "server": data}


def test_examples_load_from_an_empty_directory_as_in_the_checkout(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`example:cg_5tok` from anywhere is `-p cg_5tok` in the checkout's root, byte for byte."""
    shipped = launch.build(profile_mod.load("example:cg_5tok"))
    assert shipped.profile == "cg_5tok"
    monkeypatch.chdir(EXAMPLES_DIR.parent)
    checkout = launch.build(profile_mod.load("cg_5tok"))
    assert (shipped.unit, shipped.digest) == (checkout.unit, checkout.digest)


def test_a_bare_name_outside_the_checkout_points_at_the_example(elsewhere: Path) -> None:
    with pytest.raises(InputError) as caught:
        profile_mod.load("cg_5tok")
    assert str(caught.value).startswith(
        "unknown profile 'cg_5tok' (the shipped example is example:cg_5tok); no folder ./profiles/"
    )
    with pytest.raises(InputError, match=r"did you mean 'example:cg_5tok'\?\); shipped examples: base, "):
        profile_mod.load("example:cg5tok")
    with pytest.raises(InputError, match=r"unknown profile 'example:\.\./profiles/base'"):
        profile_mod.load("example:../profiles/base")


def test_the_folder_is_the_option_else_the_variable_else_dot_profiles(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _folder(elsewhere / "profiles", p=_port({"port": 30001}))
    _folder(elsewhere / "from_env", p=_port({"port": 30002}))
    _folder(elsewhere / "from_option", p=_port({"port": 30003}))
    runner = CliRunner()

    def port(*argv: str) -> int:
        result = runner.invoke(cli, [*argv, "render", "--json", "-p", "p"])
        assert result.exit_code == 0, result.output
        args = json.loads(result.stdout)["argv"]
        return int(args[args.index("--port") + 1])

    assert port() == 30001
    monkeypatch.setenv("ORCHESTRATOR_PROFILES", str(elsewhere / "from_env"))
    assert port() == 30002
    assert port("--profiles-dir", str(elsewhere / "from_option")) == 30003
    result = runner.invoke(cli, ["--profiles-dir", str(elsewhere / "missing"), "validate"])
    assert result.exit_code == 2 and "does not exist" in result.output, result.output


def test_a_stray_file_never_shadows_a_profile(elsewhere: Path) -> None:
    """The rule is by spelling: `base` is the folder's, `./base.yml` the file, `example:base` shipped."""
    (elsewhere / "cg_5tok.yml").write_text("server: {port: 1}\n")
    (elsewhere / "example:cg_5tok").write_text("server: {port: 1}\n")
    with pytest.raises(InputError, match="the shipped example is example:cg_5tok"):
        profile_mod.load("cg_5tok")
    assert profile_mod.load("example:cg_5tok").server.port == 30000
    _folder(elsewhere / "profiles", cg_5tok=_port({"port": 30009}))
    assert profile_mod.load("cg_5tok").server.port == 30009


def test_extends_reads_names_as_p_does_and_an_example_keeps_to_the_examples(elsewhere: Path) -> None:
    """A team's folder may hold its own `base`: the shipped examples still extend the shipped one,
    and the team's profiles extend the team's (or a shipped one, by `example:NAME`)."""
    base = yaml.safe_load((EXAMPLES_DIR / "base.yml").read_text())
    base["server"]["port"] = 31000
    _folder(
        elsewhere / "profiles",
        base=base,
        mine={"extends": "base", "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d"}},
        tuned={"extends": "example:cg_2step", "server": {"port": 31001}},
        lost={"extends": "cg_16tok"},
    )
    assert profile_mod.load("example:cg_5tok").server.port == 30000
    assert profile_mod.load("mine").server.port == 31000
    tuned = profile_mod.load("tuned")
    assert (tuned.name, tuned.server.port, tuned.speculative.num_steps) == ("tuned", 31001, 2)
    with pytest.raises(InputError, match=r"lost\.yml: extends: unknown profile 'cg_16tok' \(the shipped ex"):
        profile_mod.load("lost")


def test_profiles_shows_where_each_comes_from(elsewhere: Path) -> None:
    _folder(elsewhere / "profiles", mine=_port({"port": 30001}))
    result = CliRunner().invoke(cli, ["profiles"])
    assert result.exit_code == 0, result.output
    cells = [line.split("│")[1:3] for line in result.stdout.splitlines() if line.startswith("│")]
    rows = {name.strip(): source.strip() for name, source in cells if name.strip()}
    assert rows == {"mine": "folder"} | {f"example:{name}": "shipped" for name in profile_mod.examples()}
    assert f"profiles folder: ./profiles/; shipped examples (example:NAME): {EXAMPLES_DIR}" in result.stdout


def test_validate_with_no_profile_checks_the_folder_and_the_examples(elsewhere: Path) -> None:
    result = CliRunner().invoke(cli, ["validate"])
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in result.stdout.splitlines()] == [
        f"example:{name}" for name in profile_mod.examples()
    ]


def test_the_checkout_lists_its_profiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the repository's root ./profiles/ is the examples' folder: no `example:` twins."""
    monkeypatch.delenv("ORCHESTRATOR_PROFILES", raising=False)
    monkeypatch.chdir(EXAMPLES_DIR.parent)
    assert profile_mod.every() == {name: Path("profiles", f"{name}.yml") for name in profile_mod.examples()}


@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_symlink_loop_is_one_line_naming_the_link(elsewhere: Path, command: str) -> None:
    """a.yml -> b.yml -> a.yml, a link to itself, and `extends:` naming either: Path.resolve()
    raised RuntimeError (a traceback), and is_file() said the file was merely missing."""
    (elsewhere / "a.yml").symlink_to("b.yml")
    (elsewhere / "b.yml").symlink_to("a.yml")
    (elsewhere / "self.yml").symlink_to("self.yml")
    (elsewhere / "child.yml").write_text("extends: ./a.yml\n")
    (elsewhere / "own.yml").write_text("extends: self.yml\n")
    cases = {
        "./a.yml": "error: profile file './a.yml' is a symlink loop: point the link at a file\n",
        "./self.yml": "error: profile file './self.yml' is a symlink loop: point the link at a file\n",
        "./child.yml": f"error: child.yml: extends: profile file '{elsewhere / 'a.yml'}' is a symlink loop: "
        "point the link at a file\n",
        "./own.yml": f"error: own.yml: extends: profile file '{elsewhere / 'self.yml'}' is a symlink loop: "
        "point the link at a file\n",
    }
    for ref, line in cases.items():
        done = CliRunner().invoke(cli, [command, "-p", ref])
        assert (done.exit_code, done.output) == (2, line), done.output


def test_a_profiles_folder_in_a_symlink_loop_lists_the_examples(elsewhere: Path, monkeypatch) -> None:
    """$ORCHESTRATOR_PROFILES naming a symlink loop: Path.resolve() raised RuntimeError (exit 1, a crash
    log); it is a folder that is not found, as a missing one is."""
    (elsewhere / "loop").symlink_to("loop")
    monkeypatch.setenv("ORCHESTRATOR_PROFILES", str(elsewhere / "loop"))
    for command in (["profiles"], ["validate"]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0 and "internal error" not in result.output, result.output
        assert "example:cg_5tok" in result.stdout
