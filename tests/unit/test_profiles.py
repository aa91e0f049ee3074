"""Profile validation and rendering, driven by the cases in tests/data/profile_cases/.

A case gives the profile as a mapping (`profile:`) or, for what a mapping cannot hold such
as a key given twice, as the file's text (`profile_text:`); then the problems it must report
(`errors:`, one line each), the input error it must raise (`input_error:`), or the argv it
must render (`argv_contains:`, `argv_lacks:`) and the GPUs it needs (`gpus_needed:`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import InputError, ProfileError
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

CASES = Path(__file__).parent.parent / "data" / "profile_cases"


def _cases(key: str) -> list[Path]:
    return [p for p in sorted(CASES.glob("*.yml")) if key in yaml.safe_load(p.read_text())]


def _load_case(path: Path, tmp_path: Path) -> tuple[dict, Path]:
    case = yaml.safe_load(path.read_text())
    target = tmp_path / f"{path.stem}.yml"
    text = case["profile_text"] if "profile_text" in case else yaml.safe_dump(case["profile"])
    target.write_text(text)
    return case, target


@pytest.mark.parametrize("path", _cases("errors"), ids=lambda p: p.stem)
def test_bad_profile_reports_each_problem(path: Path, tmp_path: Path) -> None:
    case, target = _load_case(path, tmp_path)
    with pytest.raises(ProfileError) as info:
        profile_mod.load(str(target))
    lines = [f"{p.loc}: {p.message}" for p in info.value.problems]
    for expected in case["errors"]:
        assert any(line.startswith(expected) for line in lines), f"{expected!r} not in {lines}"
    assert len(lines) == len(case["errors"]), lines
    for problem in info.value.problems:
        assert str(problem).startswith(f"{target}: ")


@pytest.mark.parametrize("path", _cases("input_error"), ids=lambda p: p.stem)
def test_unreadable_profile_is_an_input_error(path: Path, tmp_path: Path) -> None:
    case, target = _load_case(path, tmp_path)
    with pytest.raises(InputError) as info:
        profile_mod.load(str(target))
    assert not isinstance(info.value, ProfileError), info.value
    assert case["input_error"] in str(info.value), str(info.value)


@pytest.mark.parametrize("path", _cases("argv_contains"), ids=lambda p: p.stem)
def test_good_profile_renders(path: Path, tmp_path: Path) -> None:
    case, target = _load_case(path, tmp_path)
    prof = profile_mod.load(str(target))
    argv = launch.build(prof).argv
    joined = "\0" + "\0".join(argv) + "\0"
    for words in case["argv_contains"]:
        assert "\0" + words.replace(" ", "\0") + "\0" in joined, (words, argv)
    for flag in case.get("argv_lacks", []):
        assert flag not in argv, (flag, argv)
    if "gpus_needed" in case:
        assert prof.server.gpus_needed == case["gpus_needed"]


def test_every_shipped_profile_is_valid() -> None:
    names = set(profile_mod.available())
    assert {"base", "baseline", "eagle3_16tok_nocg", "cg_16tok", "cg_5tok", "cg_2step"} <= names
    for name in names:
        profile_mod.load(name)


def test_cg_5tok_is_the_reference_best() -> None:
    p = profile_mod.load("cg_5tok")
    spec = p.speculative
    assert (spec.algorithm, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == ("EAGLE3", 3, 4, 5)
    assert spec.draft_model_path == "/data/eagle3/output_10k_sglang/4"
    assert p.server.cuda_graph and p.server.tp_size == 8 and p.server.port == 30000
    assert p.nccl == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MIN_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
    assert "82.3 tok/s" in p.description


def test_extends_merges_and_variant_states_only_differences() -> None:
    nocg, cg = profile_mod.load("eagle3_16tok_nocg"), profile_mod.load("cg_16tok")
    assert not nocg.server.cuda_graph and cg.server.cuda_graph
    assert nocg.speculative == cg.speculative
    assert profile_mod.load("cg_2step").speculative.num_steps == 2


def test_extends_cycle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("extends: ./b.yml\n")
    (tmp_path / "b.yml").write_text("extends: ./a.yml\n")
    with pytest.raises(InputError, match="cycle"):
        profile_mod.load(str(tmp_path / "a.yml"))


def test_unknown_profile_lists_existing() -> None:
    with pytest.raises(InputError) as info:
        profile_mod.load("cg_5tk")
    assert "did you mean 'cg_5tok'" in str(info.value)
    assert "baseline" in str(info.value)


def test_null_resets_to_default(tmp_path: Path) -> None:
    (tmp_path / "p.yml").write_text("extends: cg_5tok\nspeculative: null\n")
    assert profile_mod.load(str(tmp_path / "p.yml")).speculative.algorithm is None


def test_api_key_becomes_a_config_file_not_an_argument(tmp_path: Path) -> None:
    (tmp_path / "p.yml").write_text("extends: cg_5tok\napi_key: {env: SGLANG_KEY}\n")
    p = launch.build(profile_mod.load(str(tmp_path / "p.yml")))
    # systemd hands the root-only file to the server (whatever its user) as a credential.
    assert p.argv[-2:] == ["--config", "${CREDENTIALS_DIRECTORY}/sglang-config.yaml"]
    assert "LoadCredential=sglang-config.yaml:/etc/orchestrator/sglang.config.yaml\n" in p.unit
    assert "--config ${CREDENTIALS_DIRECTORY}/sglang-config.yaml\n" in p.unit  # unescaped: systemd expands it
    assert "--api-key" not in p.argv and "SGLANG_KEY" not in p.unit


# --- issue 13: loading ---------------------------------------------------------------


def test_merge_keys_may_be_overridden_but_keys_not_repeated(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text("base: &b {tp_size: 4, port: 31000}\nserver:\n  <<: *b\n  tp_size: 8\n")
    data, _ = profile_mod.load_raw(str(path))
    assert data["server"] == {"tp_size": 8, "port": 31000}
    path.write_text("server:\n  tp_size: 4\n  port: 1\n  tp_size: 8\n")
    with pytest.raises(InputError, match=r"line 4, column 3: duplicate key 'tp_size' \(first on line 2\)"):
        profile_mod.load_raw(str(path))


def test_equal_keys_of_different_spelling_are_duplicates(tmp_path: Path) -> None:
    """`1` and `1.0` (or `true`) are one key of a Python dict: the first would vanish silently."""
    path = tmp_path / "p.yml"
    path.write_text("env: {1: a, 1.0: b}\n")
    with pytest.raises(InputError, match=r"duplicate key 1\.0 "):
        profile_mod.load_raw(str(path))


@pytest.fixture
def profiles_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped profiles, copied where one more (broken) file can be added."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name, path in profile_mod.available().items():
        (folder / f"{name}.yml").write_text(path.read_text())
    monkeypatch.setenv("ORCHESTRATOR_PROFILES", str(folder))
    return folder


@pytest.mark.parametrize("content", ["server: [unclosed\n", "server: {tp_size: 1}\nserver: {tp_size: 2}\n"])
def test_one_unparsable_profile_does_not_hide_the_others(profiles_dir: Path, content: str) -> None:
    """Issue 13: `validate` (all) and `profiles` stopped at the first file that did not parse."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    (profiles_dir / "broken.yml").write_text(content)
    runner = CliRunner()
    result = runner.invoke(cli, ["validate"])
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output
    for name in ("base", "cg_5tok", "baseline"):
        assert f"ok: {name} " in result.stdout, result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {profiles_dir / 'broken.yml'}: not valid YAML: line "), line

    result = runner.invoke(cli, ["profiles"])
    assert result.exit_code == 2, result.output
    assert "cg_5tok" in result.stdout and "broken" in result.stdout, result.stdout
    assert result.stderr.startswith(f"error: {profiles_dir / 'broken.yml'}: not valid YAML"), result.stderr
