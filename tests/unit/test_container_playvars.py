"""The preflight checks a container profile sends to its hosts (orchestrator/hosts/playvars.py
PreflightChecks): the engine, the image and the pull policy, with `python` the image's and the
flags those of the argv inside the container, the host runtime's word for word."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.hosts import playvars
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

IMAGE = "docker.io/lmsysorg/sglang:v0.5.9@sha256:" + "0123456789abcdef" * 4


def _checks(tmp_path: Path, runtime: dict | None, **more: object) -> playvars.PreflightChecks:
    doc = {"extends": "cg_5tok", **({"runtime": runtime} if runtime else {}), **more}
    (tmp_path / "p.yml").write_text(yaml.safe_dump(doc))
    prof = profile_mod.load(str(tmp_path / "p.yml"))
    built = launch.build(prof)
    return playvars.for_profile(prof, built, playvars.unit_facts(prof)).preflight


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_a_container_profile_checks_its_engine_and_image(tmp_path: Path, kind: str) -> None:
    on_host = _checks(tmp_path, None)
    mounts = [{"source": "/data/hf", "target": "/root/.cache/huggingface"}]
    in_image = _checks(tmp_path, {"kind": kind, "image": IMAGE, "pull": "never", "mounts": mounts})
    assert (in_image.engine, in_image.image, in_image.pull) == (kind, IMAGE, "never")
    assert in_image.mounts == ["/data/hf"]  # model and drafter are checked as model_path, draft_model_path
    assert in_image.flags == on_host.flags and in_image.python == on_host.python
    assert in_image.model_path == on_host.model_path and in_image.draft_model_path == on_host.draft_model_path


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_the_whole_run_command_goes_to_the_engines_own_create(tmp_path: Path, kind: str) -> None:
    """The unit's words after `ENGINE run`, with systemd's one expansion (the --config word), and
    the secret files that create gets empty stand-ins for."""
    runtime = {"kind": kind, "image": IMAGE}
    checks = _checks(tmp_path, runtime, api_key={"env": "K"}, secret_env={"HF_TOKEN": {"env": "T"}})
    built = launch.build(profile_mod.load(str(tmp_path / "p.yml")))
    assert built.exec_argv[1] == "run" and checks.run_words[:-2] == built.exec_argv[2:-2]
    assert built.exec_argv[-2:] == ["--config", launch.CREDENTIAL_ARG]
    assert checks.run_words[-2:] == ["--config", "/run/credentials/sglang.service/sglang-config.yaml"]
    assert checks.secret_files == ["/etc/orchestrator/sglang.config.yaml", "/etc/orchestrator/sglang.env"]


def test_the_adaptive_config_is_mounted_where_its_word_points(tmp_path: Path) -> None:
    """The --speculative-adaptive-config word is expanded like --config's, and its file, which the
    unit step writes, is one that create gets an empty stand-in for."""
    runtime = {"kind": "docker", "image": IMAGE}
    spec = {"eagle_topk": None, "num_draft_tokens": None, "adaptive": {"tiers": {1: [1, 3]}}}
    checks = _checks(tmp_path, runtime, server={"sglang_version": "0.5.23"}, speculative=spec)
    built = launch.build(profile_mod.load(str(tmp_path / "p.yml")))
    where = "/run/credentials/sglang.service/sglang-adaptive.json"
    assert f"--volume=/etc/orchestrator/sglang.tiers.json:{where}:ro" in built.engine_argv
    assert checks.run_words[-2:] == ["--speculative-adaptive-config", where]
    assert checks.secret_files == ["/etc/orchestrator/sglang.tiers.json"]


def test_the_host_runtime_sends_no_engine(tmp_path: Path) -> None:
    checks = _checks(tmp_path, None)
    assert (checks.engine, checks.image, checks.pull, checks.mounts) == ("", "", "missing", [])
    assert (checks.run_words, checks.secret_files) == ([], [])
