"""Rendering: flags exist in each version's real --help, argv parses, ExecStart quoting round-trips."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import logs_command
from orchestrator.cli import main as main_mod
from orchestrator.cli.main import cli
from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_flags
from orchestrator.render import launch


def _help_parser(version: str):
    """SGLang's parser rebuilt from the real --help text shipped in orchestrator/profile/sglang_help/."""
    text = sglang_flags.help_path(version).read_text()
    return sglang_flags.build_parser(sglang_flags.FlagTable(version, sglang_flags.parse_help(text)))


def _help_flags(version: str) -> set[str]:
    text = sglang_flags.help_path(version).read_text()
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", text))


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
def test_every_emittable_flag_is_in_that_versions_help(version: str) -> None:
    emitted = {sglang_flags.flag(setting, version) for setting in sglang_flags.MODELLED} - {None}
    missing = emitted - _help_flags(version)
    assert not missing, f"renderer emits flags SGLang {version} lacks: {missing}"


def test_cuda_graph_max_bs_spelling_differs_between_versions() -> None:
    assert "--cuda-graph-max-bs" in _help_flags("0.5.9")
    assert "--cuda-graph-max-bs" not in _help_flags("0.5.23")
    assert sglang_flags.flag("cuda_graph_max_bs", "0.5.23") == "--cuda-graph-max-bs-decode"


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
@pytest.mark.parametrize("name", ["cg_5tok", "baseline", "eagle3_16tok_nocg", "cg_16tok", "cg_2step"])
def test_rendered_argv_is_accepted_by_that_versions_parser(name: str, version: str, tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text(f"extends: {name}\nserver: {{sglang_version: '{version}', cuda_graph_max_bs: 16}}\n")
    if name == "eagle3_16tok_nocg":  # CUDA graphs off: no batch size to capture
        path.write_text(f"extends: {name}\nserver: {{sglang_version: '{version}'}}\n")
    argv = launch.build(profile_mod.load(str(path))).argv
    assert argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    args = _help_parser(version).parse_args(argv[3:])
    assert args.model_path == "/data/models/Kimi-K2.5"


def test_0523_parser_rejects_the_0_5_9_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _help_parser("0.5.23").parse_args(["--model-path", "/m", "--cuda-graph-max-bs", "8"])
    assert info.value.code == 2
    assert "ambiguous option: --cuda-graph-max-bs" in capsys.readouterr().err


# --- systemd quoting -----------------------------------------------------------------


NASTY = [
    "/data/models/with space",
    'quote"inside',
    "single'quote",
    "back\\slash",
    "50%",
    "%n%i",
    "$HOME",
    "${USER}",
    "$$",
    "tab\there",
    "new\nline",
    ";",
    "",
    "ünïcödé",
    "--flag=a b",
]


@pytest.mark.parametrize("arg", NASTY)
def test_exec_start_round_trips(arg: str) -> None:
    argv = ["/usr/bin/python3", "-m", "sglang.launch_server", "--served-model-name", arg, "--port", "1"]
    assert launch.unquote_exec(launch.exec_start(argv)) == argv


def test_plan_argv_round_trips_through_the_unit(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    nasty = "{model_path: '/data/my models/K2 $HOME 100%', served_model_name: 'a\"b\\\\c'}"
    path.write_text(f"extends: cg_5tok\nserver: {nasty}\n")
    p = launch.build(profile_mod.load(str(path)))
    value = re.search(r"^ExecStart=(.*?)(?=\n\S)", p.unit, re.S | re.M).group(1)
    assert launch.unquote_exec(value) == p.argv


def test_environment_values_are_escaped() -> None:
    """Environment= does no `$` expansion: `$$` would reach the process as `$$` (ExecStart= does)."""
    assert launch.environment_line("A", 'x "y" $Z 5%') == '"A=x \\"y\\" $Z 5%%"'
    assert launch.quote_exec_arg('x "y" $Z 5%') == '"x \\"y\\" $$Z 5%%"'


def test_unit_shows_every_character() -> None:
    """A tab or a control character would be invisible in `render`: each is a visible escape."""
    assert launch.quote_exec_arg("a\tb\nc\x01\x7f") == '"a\\tb\\nc\\x01\\x7f"'
    assert launch.environment_line("A", "\t\x1b") == '"A=\\t\\x1b"'


def test_parse_unit_reads_dollars_as_systemd_does() -> None:
    unit = 'Environment="A=a$HOME" "B=$$"\nExecStart=/usr/bin/python3 "a$$HOME"\nRestart=no\n'
    assert launch.parse_unit(unit) == (["/usr/bin/python3", "a$HOME"], {"A": "a$HOME", "B": "$$"})


def test_only_the_planned_credential_word_is_left_for_systemd_to_expand(tmp_path: Path) -> None:
    """#21: the API key's --config word is written unescaped by its place (Plan.credential_at); the
    same text from a profile is escaped like every other `$` (tests/unit/test_systemd_oracle.py has
    systemd's reading). A multi-node rank's words come after it and leave its place alone."""
    word = launch.CREDENTIAL_ARG
    path = tmp_path / "p.yml"
    path.write_text(
        f"extends: cg_5tok_2node\napi_key: {{env: K}}\n"
        f"server: {{served_model_name: '{word}', extra_args: [--chat-template, '{word}']}}\n"
    )
    p = launch.build(
        profile_mod.load(str(path)), launch.Node(rank=1, nnodes=2, dist_init_addr="10.0.0.1:5757")
    )
    assert [i for i, arg in enumerate(p.argv) if arg == word] == [
        p.argv.index("--served-model-name") + 1,
        p.credential_at,
        len(p.argv) - 1,
    ]
    assert p.argv[p.credential_at - 1] == "--config" and p.to_json()["credential_at"] == p.credential_at
    assert p.unit.count(f' "$${{CREDENTIALS_DIRECTORY}}/{launch.CREDENTIAL}"') == 2
    assert p.unit.count(f" --config {word} \\\n") == 1
    started = p.started_argv("/run/credentials/x")
    assert started[p.credential_at] == f"/run/credentials/x/{launch.CREDENTIAL}" and started.count(word) == 2
    assert launch.parse_unit(p.unit, {"CREDENTIALS_DIRECTORY": "/run/credentials/x"})[0] == started
    assert launch.parse_unit(p.unit)[0] == p.argv


def test_render_refuses_a_working_directory_that_would_swallow_a_line() -> None:
    """Past validation too: `/srv/sglang\\` would make the next unit line part of WorkingDirectory."""
    good = profile_mod.load("cg_5tok")
    bad = good.model_copy(update={"service": good.service.model_copy(update={"working_directory": "/x\\"})})
    with pytest.raises(ValueError, match=r"service\.working_directory: .*backslash"):
        launch.build(bad)


def test_working_directory_escapes_specifiers_only() -> None:
    good = profile_mod.load("cg_5tok")
    svc = good.service.model_copy(update={"working_directory": '/srv/50% "a" $b'})
    unit = launch.build(good.model_copy(update={"service": svc})).unit
    assert 'WorkingDirectory=/srv/50%% "a" $b\n' in unit


# --- CLI -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["stop", "rollback", "logs"])
def test_a_unit_name_systemd_cannot_use_is_bad_input(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """#21: `--unit` is a unit name as systemd takes it, before any host is asked (or a lab started:
    without an inventory these commands use the lab's)."""

    def no_hosts(*args: object) -> None:
        raise AssertionError("the command went on to its hosts")

    for module in (main_mod, logs_command):
        for name in ("inventory_or_lab", "inventory_or_running_lab"):
            monkeypatch.setattr(module, name, no_hosts, raising=False)
    result = CliRunner().invoke(cli, [command, "--unit", "sglang@.service"])
    assert result.exit_code == 2, result.output
    assert "'sglang@.service' names a template ('@')" in result.output


def test_render_json_shape() -> None:
    result = CliRunner().invoke(cli, ["render", "--profile", "cg_5tok", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"argv", "environment", "unit"}
    assert data["environment"]["NCCL_PROTO"] == "LL"
    assert "--speculative-algorithm" in data["argv"]


def test_render_prints_the_unit() -> None:
    result = CliRunner().invoke(cli, ["render", "--profile", "cg_5tok"])
    assert result.exit_code == 0
    assert result.output == launch.build(profile_mod.load("cg_5tok")).unit
    assert result.output.startswith("# Managed by orchestrator")


def test_invalid_profile_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    case = Path(__file__).parent.parent / "data" / "profile_cases" / "five_mistakes.yml"
    import yaml

    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(yaml.safe_load(case.read_text())["profile"]))
    result = CliRunner().invoke(cli, ["validate", "--profile", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 5, lines
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert "Traceback" not in result.output


def test_unknown_profile_exits_2() -> None:
    result = CliRunner().invoke(cli, ["render", "--profile", "nope"])
    assert result.exit_code == 2
    assert "unknown profile 'nope'" in result.output and "cg_5tok" in result.output


def test_profiles_table_and_schema() -> None:
    result = CliRunner().invoke(cli, ["profiles"])
    assert result.exit_code == 0
    for name in ("baseline", "cg_5tok", "cg_2step", "eagle3_16tok_nocg", "cg_16tok"):
        assert name in result.output
    schema = json.loads(CliRunner().invoke(cli, ["schema"]).output)
    assert schema["additionalProperties"] is False
    assert "speculative" in schema["properties"]


def test_render_against_lists_only_the_flags_that_change():
    result = CliRunner().invoke(cli, ["render", "-p", "cg_2step", "--against", "cg_5tok"])
    assert result.exit_code == 0, result.output
    assert result.output == "cg_5tok -> cg_2step: 1 change(s)\n  --speculative-num-steps: 3 -> 2\n"
    result = CliRunner().invoke(cli, ["render", "-p", "baseline", "--against", "cg_5tok", "--json"])
    changes = json.loads(result.output)["changes"]
    assert "--speculative-algorithm: EAGLE3 -> (removed)" in changes and len(changes) == 5
    result = CliRunner().invoke(cli, ["render", "-p", "cg_5tok", "--against", "no_such_profile"])
    assert result.exit_code == 2 and "no_such_profile" in result.output
