"""Any SGLang release from 0.5.9 on (issue 15): its flags come from the nearest shipped --help at
or below it, the unit says which, `render` says when it is another version's, and preflight
still checks the profile's own version and the host's own --help."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.errors import ProfileError
from orchestrator.hosts import playvars
from orchestrator.lab import standins
from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_flags, sglang_rules
from orchestrator.render import launch

ROOT = Path(__file__).resolve().parents[2]


def _profile(tmp_path: Path, version: str, extra: str = "") -> profile_mod.Profile:
    path = tmp_path / f"v{len(list(tmp_path.iterdir()))}.yml"
    server = f"{{sglang_version: '{version}', cuda_graph_max_bs: 32{extra}}}"
    path.write_text(f"extends: cg_5tok\nserver: {server}\n")
    return profile_mod.load(str(path))


# --- the version rule ----------------------------------------------------------------


def test_release_numbers_order_as_pip_orders_them() -> None:
    ordered = ["0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.13.post1", "0.5.20", "0.6.0", "1.0.0"]
    assert sorted(reversed(ordered), key=sglang_flags.version_key) == ordered


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10.post1", "0.5.16", "0.5.23", "0.5.24", "0.6.0"])
def test_any_release_from_0_5_9_on_is_accepted(version: str, tmp_path: Path) -> None:
    assert sglang_flags.version_problem(version) is None
    assert _profile(tmp_path, version).server.sglang_version == version


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("0.5.8.post1", "SGLang 0.5.8.post1 is older than 0.5.9, the oldest release orchestrator renders"),
        ("0.4.0", "SGLang 0.4.0 is older than 0.5.9"),
        ("latest", "'latest' is not an SGLang release number such as 0.5.9 or 0.5.10.post1"),
        ("0.5", "'0.5' is not an SGLang release number"),
        ("v0.5.9", "'v0.5.9' is not an SGLang release number"),
        ("0.5.9 ", "'0.5.9 ' is not an SGLang release number"),
        ("0.5.10rc1", "'0.5.10rc1' is not an SGLang release number"),
    ],
)
def test_other_versions_are_refused_saying_what_is_accepted(version: str, message: str, tmp_path: Path):
    with pytest.raises(ProfileError) as info:
        _profile(tmp_path, version)
    (line,) = [f"{p.loc}: {p.message}" for p in info.value.problems]
    assert line.startswith(f"server.sglang_version: {message}"), line


# --- nearest shipped help at or below ------------------------------------------------


def test_shipped_helps_are_the_files_oldest_first() -> None:
    files = sorted(p.name for p in sglang_flags.HELP_DIR.glob("launch_server-help-*.txt"))
    assert sorted(sglang_flags.help_path(v).name for v in sglang_flags.SHIPPED) == files
    assert list(sglang_flags.SHIPPED) == sorted(sglang_flags.SHIPPED, key=sglang_flags.version_key)
    assert sglang_flags.SHIPPED[0] == sglang_flags.OLDEST
    assert {"0.5.9", "0.5.15", "0.5.20", "0.5.23"} <= set(sglang_flags.SHIPPED)


@pytest.mark.parametrize(
    ("version", "used"),
    [
        ("0.5.9", "0.5.9"),
        ("0.5.10", "0.5.9"),
        ("0.5.14", "0.5.9"),
        ("0.5.15", "0.5.15"),
        ("0.5.15.post1", "0.5.15"),
        ("0.5.19", "0.5.15"),
        ("0.5.20", "0.5.20"),
        ("0.5.22", "0.5.20"),
        ("0.5.23", "0.5.23"),
        ("0.6.0", "0.5.23"),
    ],
)
def test_flags_come_from_the_nearest_shipped_help_at_or_below(version: str, used: str) -> None:
    assert sglang_flags.help_version(version) == used
    assert sglang_flags.flag_table(version).version == used
    assert sglang_flags.flag_table(version) is sglang_flags.flag_table(used)


def test_a_version_below_the_oldest_has_no_help() -> None:
    with pytest.raises(KeyError, match=re.escape("older than 0.5.9")):
        sglang_flags.help_version("0.5.8")


def test_modelled_spellings_hold_from_their_version_on() -> None:
    # --cuda-graph-max-bs is a deprecated alias from 0.5.14 and gone in 0.5.20's help.
    assert sglang_flags.flag("cuda_graph_max_bs", "0.5.19") == "--cuda-graph-max-bs"
    assert sglang_flags.flag("cuda_graph_max_bs", "0.5.20") == "--cuda-graph-max-bs-decode"
    assert "--cuda-graph-max-bs" in sglang_flags.flag_table("0.5.15").names
    assert "--cuda-graph-max-bs" not in sglang_flags.flag_table("0.5.20").names
    assert sglang_flags.flag("tp_size", "0.5.22") == "--tensor-parallel-size"
    assert sglang_flags.flag("tp_size", "0.5.23") == "--tp-size"
    assert sglang_flags.at_or_below({"0.5.9": "a", "0.5.13": "b"}, "0.5.12.post1") == "a"
    assert sglang_flags.at_or_below({"0.5.9": "a", "0.5.13": "b"}, "0.5.13") == "b"


def test_rules_from_sglangs_source_follow_the_profiles_release() -> None:
    """0.5.13 moved the speculative checks into speculative_hook and let triton draw page trees:
    that is the release's own behaviour, whichever help spells its flags."""
    args = ["--page-size", "16", "--attention-backend", "triton"]
    found = list(
        sglang_rules.check_speculative_server(
            sglang_version="0.5.12", algorithm="EAGLE3", eagle_topk=4, dp_size=1, extra_args=args
        )
    )
    assert found and "needs attention backend flashinfer or fa3 in SGLang 0.5.12" in found[0][1]
    for version in ("0.5.13", "0.5.14", "0.5.23"):
        assert not list(
            sglang_rules.check_speculative_server(
                sglang_version=version, algorithm="EAGLE3", eagle_topk=4, dp_size=1, extra_args=args
            )
        )


# --- the unit and render say which help ----------------------------------------------


@pytest.mark.parametrize(
    ("version", "used"), [("0.5.9", "0.5.9"), ("0.5.16", "0.5.15"), ("0.5.21", "0.5.20")]
)
def test_the_unit_records_the_help_its_flags_come_from(version: str, used: str, tmp_path: Path) -> None:
    unit = launch.build(_profile(tmp_path, version)).unit
    assert f"\n# sglang: {version}\n# sglang flags: from the --help of {used}\n[Unit]\n" in unit


def test_a_version_without_its_own_help_renders_as_its_nearest_but_is_its_own_unit(tmp_path: Path) -> None:
    ours, nearest = launch.build(_profile(tmp_path, "0.5.17")), launch.build(_profile(tmp_path, "0.5.15"))
    assert ours.argv == nearest.argv
    assert "--cuda-graph-max-bs" in ours.argv and "--tensor-parallel-size" in ours.argv
    assert ours.digest != nearest.digest  # so preflight never skips a check on a version change


def test_preflight_checks_the_profiles_version_with_flags_spelled_from_the_help(tmp_path: Path) -> None:
    prof = _profile(tmp_path, "0.5.21")
    built = launch.build(prof)
    checks = playvars.preflight_checks(prof, built, [0, 1, 2, 3, 4, 5, 6, 7], False)
    assert checks.sglang_version == "0.5.21"  # what the host must have installed
    assert "--cuda-graph-max-bs-decode" in checks.flags  # checked against the host's own --help
    assert checks.skip_flags_if_digest == built.digest


def _render(tmp_path: Path, version: str) -> tuple[str, str]:
    path = tmp_path / "r.yml"
    path.write_text(f"extends: base\nserver: {{sglang_version: '{version}'}}\n")
    result = CliRunner().invoke(cli, ["render", "-p", str(path)])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def test_render_says_when_the_flags_come_from_another_versions_help(tmp_path: Path) -> None:
    stdout, stderr = _render(tmp_path, "0.5.16")
    assert stderr == (
        "note: SGLang 0.5.16 has no shipped --help; flags are spelled from 0.5.15's, and preflight "
        "checks them against the host's own --help\n"
    )
    assert stdout.startswith("# Managed by orchestrator")  # the unit's bytes alone


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
def test_render_says_nothing_for_a_shipped_help(version: str, tmp_path: Path) -> None:
    assert _render(tmp_path, version)[1] == ""


def test_messages_a_help_decides_name_the_help_read() -> None:
    (found,) = sglang_rules.check_extra_args("0.5.16", ["--max-runing-requests", "8"])
    assert found[1] == (
        "--max-runing-requests is not a flag of SGLang 0.5.16 (read with 0.5.15's --help); "
        "did you mean --max-running-requests?"
    )
    (found,) = sglang_rules.check_extra_args("0.5.15", ["--max-runing-requests", "8"])
    assert "not a flag of SGLang 0.5.15;" in found[1]


# --- the lab stand-in acts only versions whose real help it has -----------------------


def test_the_standin_installs_every_shipped_help_and_refuses_others(tmp_path: Path) -> None:
    standins.install_packages(tmp_path, "0.5.15")
    package = tmp_path / standins.DIST_PACKAGES / "sglang"
    assert sorted(p.name for p in (package / "_help").iterdir()) == sorted(
        p.name for v in sglang_flags.SHIPPED for p in (sglang_flags.help_path(v), sglang_flags.types_path(v))
    )
    assert '"0.5.15"' in (package / "version.py").read_text()
    with pytest.raises(ValueError, match=re.escape("unsupported SGLang version 0.5.16")):
        standins.set_sglang_version(tmp_path, "0.5.16")


# --- the shipped texts are as scripts/sglang_help.py writes them ------------------------


def _script():
    spec = importlib.util.spec_from_file_location("sglang_help_script", ROOT / "scripts/sglang_help.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
def test_shipped_help_is_as_the_refresh_script_writes_it(version: str) -> None:
    script = _script()
    text = sglang_flags.help_path(version).read_text()
    script.verify(version, text)  # usage line, the options section, --model-path, --port, --config
    assert text.endswith("\n\n")  # print(format_help())
    described = [line for line in text.splitlines() if re.match(r" {24}\S.* ", line)]
    assert max(len(line) for line in described) == 78  # COLUMNS=80: argparse wraps at 78
    assert not script.hidden_report(version, [list(o.names) for o in sglang_flags.HIDDEN.get(version, ())])


def test_the_refresh_script_refuses_a_text_that_is_not_a_launch_server_help() -> None:
    script = _script()
    not_usage = re.escape("does not start with 'usage: python -m sglang.launch_server'")
    with pytest.raises(script.Failed, match=not_usage):
        script.verify("0.5.9", "usage: launch_server.py [-h]\n\noptions:\n")
    with pytest.raises(script.Failed, match="lacks --config, --model-path, --port"):
        script.verify("0.5.9", "usage: python -m sglang.launch_server [-h]\n\noptions:\n  -h, --help  x\n")
    assert "hides --x from --help" in script.hidden_report("0.5.9", [["--x"]])
