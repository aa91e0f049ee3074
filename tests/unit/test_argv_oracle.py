"""The argv a profile renders, read by SGLang's argparse (built from the version's real `--help`,
which tests/unit/test_extra_args.py cross-checks against SGLang's own parser): every value the
profile sets arrives as the profile says, whatever text it holds, or the profile is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputError
from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_flags
from orchestrator.render import launch

VERSIONS = list(sglang_flags.SHIPPED)
#: Free text as a user might type it, and as an attacker would: quotes, `$`, `%`, backslashes,
#: newlines, leading dashes and spaces, unicode.
TEXT = st.text(alphabet=st.sampled_from(list("ab -_=./\"'$%\\\n\t;&|*?~#é漢")), min_size=1, max_size=24)


def _parsed(version: str, argv: list[str]) -> dict[str, str | None]:
    """setting -> the value SGLang's argparse reads for its flag (as text; None when absent)."""
    table = sglang_flags.flag_table(version)
    args = vars(sglang_flags.build_parser(table).parse_args(argv[3:]))
    out = {}
    for setting in SETTINGS:
        flag = sglang_flags.flag(setting, version)
        value = args.get(table.option(flag).dest) if flag else None
        out[setting] = None if value is None else str(value)
    return out


SETTINGS = (
    "model_path",
    "served_model_name",
    "tp_size",
    "port",
    "host",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _load(tmp_path: Path, version: str, name: str, model: str) -> profile_mod.Profile | None:
    path = tmp_path / "p.yml"
    server = {"sglang_version": version, "served_model_name": name, "model_path": f"/m/{model}"}
    path.write_text(yaml.safe_dump({"extends": "cg_5tok", "server": server}))
    try:
        return profile_mod.load(str(path))
    except InputError:
        return None  # refused, with a message: the other half of the contract


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(profile_mod.examples()))
def test_every_shipped_profile_parses_to_its_own_settings(version: str, name: str, tmp_path: Path):
    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump({"extends": name, "server": {"sglang_version": version}}))
    prof = profile_mod.load(str(path))
    args = _parsed(version, launch.build(prof).argv)
    s, spec = prof.server, prof.speculative
    want = {
        "model_path": s.model_path,
        "served_model_name": s.served_model_name,
        "tp_size": s.tp_size,
        "port": s.port,
        "host": s.host,
        "speculative_algorithm": spec.algorithm,
        "speculative_draft_model_path": spec.draft_model_path,
        "speculative_num_steps": spec.num_steps,
        "speculative_eagle_topk": spec.eagle_topk if spec.num_steps is not None else None,
        "speculative_num_draft_tokens": spec.num_draft_tokens if spec.num_steps is not None else None,
    }
    assert args == {k: _text(v) for k, v in want.items()}


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=TEXT, model=TEXT)
def test_free_text_reaches_sglang_as_written_or_is_refused(version: str, name: str, model: str, tmp_path):
    prof = _load(tmp_path, version, name, model)
    if prof is None:
        return
    args = _parsed(version, launch.build(prof).argv)
    assert args["served_model_name"] == prof.server.served_model_name
    assert args["model_path"] == prof.server.model_path


@pytest.mark.parametrize("version", VERSIONS)
def test_adaptive_reaches_sglang_0_5_23_only(version: str, tmp_path: Path) -> None:
    """The adaptive flags, read by the version's argparse: set as the profile says on 0.5.23, and
    refused (with a message) where orchestrator does not follow that version's adaptive rules."""
    path = tmp_path / "p.yml"
    spec = {"num_steps": 5, "eagle_topk": None, "num_draft_tokens": None, "adaptive": {"tiers": {1: [3, 5]}}}
    path.write_text(
        yaml.safe_dump({"extends": "cg_5tok", "server": {"sglang_version": version}, "speculative": spec})
    )
    try:
        prof = profile_mod.load(str(path))
    except InputError as exc:
        assert version != "0.5.23" and "speculative.adaptive: " in str(exc)
        return
    assert version == "0.5.23"
    plan = launch.build(prof)
    args = vars(
        sglang_flags.build_parser(sglang_flags.flag_table(version)).parse_args(plan.started_argv()[3:])
    )
    assert args["speculative_adaptive"] is True
    assert args["speculative_adaptive_config"] == "/run/credentials/sglang.service/sglang-adaptive.json"
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"]) == (5, None)
    assert args["speculative_num_draft_tokens"] is None
