"""Profile validation and rendering, driven by the cases in tests/data/profile_cases/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator import plan, profile
from orchestrator.errors import InputError, ProfileError

CASES = Path(__file__).parent.parent / "data" / "profile_cases"


def _cases(key: str) -> list[Path]:
    return [p for p in sorted(CASES.glob("*.yml")) if key in yaml.safe_load(p.read_text())]


def _load_case(path: Path, tmp_path: Path) -> tuple[dict, Path]:
    case = yaml.safe_load(path.read_text())
    target = tmp_path / f"{path.stem}.yml"
    target.write_text(yaml.safe_dump(case["profile"]))
    return case, target


@pytest.mark.parametrize("path", _cases("errors"), ids=lambda p: p.stem)
def test_bad_profile_reports_each_problem(path: Path, tmp_path: Path) -> None:
    case, target = _load_case(path, tmp_path)
    with pytest.raises(ProfileError) as info:
        profile.load(str(target))
    lines = [f"{p.loc}: {p.message}" for p in info.value.problems]
    for expected in case["errors"]:
        assert any(line.startswith(expected) for line in lines), f"{expected!r} not in {lines}"
    assert len(lines) == len(case["errors"]), lines
    for problem in info.value.problems:
        assert str(problem).startswith(f"{target}: ")


@pytest.mark.parametrize("path", _cases("argv_contains"), ids=lambda p: p.stem)
def test_good_profile_renders(path: Path, tmp_path: Path) -> None:
    case, target = _load_case(path, tmp_path)
    argv = plan.build(profile.load(str(target))).argv
    joined = "\0" + "\0".join(argv) + "\0"
    for words in case["argv_contains"]:
        assert "\0" + words.replace(" ", "\0") + "\0" in joined, (words, argv)
    for flag in case.get("argv_lacks", []):
        assert flag not in argv, (flag, argv)


def test_every_shipped_profile_is_valid() -> None:
    names = set(profile.available())
    assert {"base", "baseline", "eagle3_16tok_nocg", "cg_16tok", "cg_5tok", "cg_2step"} <= names
    for name in names:
        profile.load(name)


def test_cg_5tok_is_the_reference_best() -> None:
    p = profile.load("cg_5tok")
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
    nocg, cg = profile.load("eagle3_16tok_nocg"), profile.load("cg_16tok")
    assert not nocg.server.cuda_graph and cg.server.cuda_graph
    assert nocg.speculative == cg.speculative
    assert profile.load("cg_2step").speculative.num_steps == 2


def test_extends_cycle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("extends: ./b.yml\n")
    (tmp_path / "b.yml").write_text("extends: ./a.yml\n")
    with pytest.raises(InputError, match="cycle"):
        profile.load(str(tmp_path / "a.yml"))


def test_unknown_profile_lists_existing() -> None:
    with pytest.raises(InputError) as info:
        profile.load("cg_5tk")
    assert "did you mean 'cg_5tok'" in str(info.value)
    assert "baseline" in str(info.value)


def test_null_resets_to_default(tmp_path: Path) -> None:
    (tmp_path / "p.yml").write_text("extends: cg_5tok\nspeculative: null\n")
    assert profile.load(str(tmp_path / "p.yml")).speculative.algorithm is None


def test_api_key_becomes_a_config_file_not_an_argument(tmp_path: Path) -> None:
    (tmp_path / "p.yml").write_text("extends: cg_5tok\napi_key: {env: SGLANG_KEY}\n")
    p = plan.build(profile.load(str(tmp_path / "p.yml")))
    assert p.argv[-2:] == ["--config", "/etc/orchestrator/sglang.config.yaml"]
    assert "--api-key" not in p.argv and "SGLANG_KEY" not in p.unit
