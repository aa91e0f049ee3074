"""Which running lab `lab up` reuses (`hosts._reuse`), with the processes faked: a --podman lab
serves a plain request too; a plain lab asked for podman is refused with what to do; so with docker,
and a podman lab is not a docker one."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.lab import nspawn


def _record(podman: bool, docker: bool = False) -> nspawn._Record:
    entry = {"address": "10.213.0.11", "dir": "/nonexistent/lab1", "console": "/nonexistent", "pid": 1}
    data = {"format": nspawn.FORMAT, "complete": True, "gpus": 8, "sglang_version": "0.5.9", "podman": podman}
    data["docker"] = docker
    return nspawn._Record({**data, "hosts": {"lab1": {**entry, "pid_start": 1}}})


@pytest.fixture(autouse=True)
def alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nspawn, "_alive", lambda pid, start: True)
    monkeypatch.setattr(nspawn, "_leader", lambda pid: 2)
    monkeypatch.setattr(nspawn, "_systemd", lambda leader: ("running", ()))
    monkeypatch.setattr(nspawn, "_lift", lambda record: False)
    for key in ("private_key", "user_key"):
        monkeypatch.setattr(nspawn, key, lambda: Path("/nonexistent/key"))


def test_a_podman_lab_is_reused_for_either_request() -> None:
    for asked in (True, False):
        state = nspawn._reuse(_record(podman=True), 1, 8, "0.5.9", asked)
        assert state is not None and state.reused and state.podman


def test_a_plain_lab_asked_for_podman_says_lab_down_first() -> None:
    assert nspawn._reuse(_record(podman=False), 1, 8, "0.5.9", False) is not None
    with pytest.raises(InputError) as refused:
        nspawn._reuse(_record(podman=False), 1, 8, "0.5.9", True)
    assert str(refused.value) == (
        "a lab is up with hosts=1 gpus=8 sglang-version=0.5.9; "
        "run `lab down` first to get hosts=1 gpus=8 sglang-version=0.5.9 --podman"
    )


def test_a_docker_lab_serves_docker_and_plain_requests_and_no_podman_one() -> None:
    for asked in (True, False):
        state = nspawn._reuse(_record(podman=False, docker=True), 1, 8, "0.5.9", False, asked)
        assert state is not None and state.docker and not state.podman
    with pytest.raises(InputError) as refused:
        nspawn._reuse(_record(podman=False, docker=True), 1, 8, "0.5.9", True)
    assert str(refused.value).endswith(
        "run `lab down` first to get hosts=1 gpus=8 sglang-version=0.5.9 --podman"
    )
    with pytest.raises(InputError) as refused:
        nspawn._reuse(_record(podman=True), 1, 8, "0.5.9", False, True)
    assert str(refused.value) == (
        "a lab is up with hosts=1 gpus=8 sglang-version=0.5.9 --podman; "
        "run `lab down` first to get hosts=1 gpus=8 sglang-version=0.5.9 --docker"
    )


def test_podman_and_docker_are_two_labs() -> None:
    with pytest.raises(InputError, match="--podman and --docker are two labs"):
        nspawn.up(hosts=1, podman=True, docker=True)
