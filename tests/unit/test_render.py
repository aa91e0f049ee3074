"""Rendering: flags exist in each version's real --help, argv parses, ExecStart quoting round-trips."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
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


# --- adaptive speculative decoding ---------------------------------------------------------


ADAPTIVE = {
    "tiers": {8: [0, 1, 3], 1: [1, 3, 5, 7]},
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
}


def _adaptive_profile(tmp_path: Path, adaptive: dict, name: str = "p") -> profile_mod.Profile:
    path = tmp_path / f"{name}.yml"
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "adaptive": adaptive}
    doc = {"extends": "base", "server": {"sglang_version": "0.5.23"}, "speculative": spec}
    path.write_text(yaml.safe_dump(doc))
    return profile_mod.load(str(path))


def _standin_loader():
    """SGLang 0.5.23's _load_adaptive_config, as the stand-in carries it (sglang/_adaptive.py)."""
    from test_standin_speed import host_module

    return host_module("_adaptive").load_config


def test_adaptive_tiers_render_the_flags_and_the_json_sglang_reads(tmp_path: Path) -> None:
    p = launch.build(_adaptive_profile(tmp_path, ADAPTIVE))
    assert p.adaptive_config == (
        "{\n"
        '  "ema_alpha": 0.2,\n  "update_interval": 5,\n  "warmup_batches": 10,\n'
        '  "down_hysteresis": -0.25,\n  "up_hysteresis": 0.0,\n'
        '  "1": {"candidate_steps": [1, 3, 5, 7]},\n'
        '  "8": {"candidate_steps": [0, 1, 3]}\n'
        "}\n"
    )
    written = tmp_path / "tiers.json"
    written.write_text(p.adaptive_config)
    knobs = {k: v for k, v in ADAPTIVE.items() if k != "tiers"}
    assert _standin_loader()(str(written)) == {
        1: {**knobs, "candidate_steps": [1, 3, 5, 7]},
        8: {**knobs, "candidate_steps": [0, 1, 3]},
    }
    assert p.adaptive_path == "/etc/orchestrator/sglang.tiers.json"
    assert "\nLoadCredential=sglang-adaptive.json:/etc/orchestrator/sglang.tiers.json\n" in p.unit
    assert "".join(f"# {line}\n" for line in p.adaptive_config.splitlines()) in p.unit
    assert p.argv[p.adaptive_at - 2 : p.adaptive_at + 1] == [
        "--speculative-adaptive",
        "--speculative-adaptive-config",
        launch.ADAPTIVE_ARG,
    ]
    started = p.started_argv("/run/credentials/x")
    assert started[p.adaptive_at] == "/run/credentials/x/sglang-adaptive.json"
    assert launch.parse_unit(p.unit, {"CREDENTIALS_DIRECTORY": "/run/credentials/x"})[0] == started
    assert p.to_json()["adaptive_config"] == p.adaptive_config


def test_a_changed_adaptive_config_is_a_changed_unit(tmp_path: Path) -> None:
    """The file is not in argv: the unit's comment carries it, so its digest (a restart, the
    ledger's record) and `render --against` see a change."""
    p = launch.build(_adaptive_profile(tmp_path, ADAPTIVE))
    other = launch.build(_adaptive_profile(tmp_path, {**ADAPTIVE, "ema_alpha": 0.3}, "q"))
    assert other.argv == p.argv and other.digest != p.digest
    assert launch.flag_changes(p.unit, other.unit) == ["adaptive ema_alpha: 0.2 -> 0.3"]


def test_sglangs_default_tiers_need_no_file(tmp_path: Path) -> None:
    p = launch.build(_adaptive_profile(tmp_path, {}))
    assert p.argv[-1] == "--speculative-adaptive" and "--speculative-adaptive-config" not in p.argv
    assert (p.adaptive_config, p.adaptive_path, p.adaptive_at) == (None, None, None)
    assert "LoadCredential" not in p.unit and "adaptive config" not in p.unit


def test_a_rollback_writes_back_the_config_its_unit_ran_with(tmp_path: Path) -> None:
    """The config travels with the unit's facts (host record and ledger): a rollback's plan writes it."""
    from orchestrator.hosts import playvars

    prof = _adaptive_profile(tmp_path, ADAPTIVE)
    p, facts = launch.build(prof), playvars.unit_facts(prof)
    hp = playvars.for_profile(prof, p, facts)
    assert (hp.adaptive_path, hp.facts.adaptive_config) == (p.adaptive_path, p.adaptive_config)
    record = {"profile": p.profile, "unit": p.unit, "digest": p.digest, "facts": facts.model_dump()}
    back = playvars.for_record(p.unit_name, record)
    assert (back.adaptive_path, back.facts.adaptive_config) == (p.adaptive_path, p.adaptive_config)
    old = {**record, "facts": {k: v for k, v in facts.model_dump().items() if k != "adaptive_config"}}
    assert playvars.for_record(p.unit_name, old).adaptive_path == ""  # recorded before adaptive
