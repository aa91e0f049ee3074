"""`lab up --docker` without a lab: which base it builds, where the stand-ins are for trixie's
Python, the host's cgroup and what `down` removes of it. The hosts themselves run in
tests/lab/test_containers.py."""

from __future__ import annotations

import site
import sys
from pathlib import Path

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.lab import nspawn, standins


def test_the_docker_base_is_trixie_with_docker_and_its_cli_and_the_others_keep_their_keys() -> None:
    assert nspawn._base_key(docker=True).startswith("trixie-docker-")
    assert nspawn._packages(False, docker=True)[-2:] == ("docker.io", "docker-cli")
    assert nspawn._base_key().startswith("bookworm-") and nspawn._base_key(podman=True).startswith(
        "bookworm-podman-"
    )
    assert len({nspawn._base_key(), nspawn._base_key(podman=True), nspawn._base_key(docker=True)}) == 3


def test_trixies_python_finds_the_standins_through_a_pth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's own site module reads the .pth as the host's python3.13 will."""
    for version in ("python3.11", "python3.13"):
        (tmp_path / "usr/lib" / version).mkdir(parents=True)
        (tmp_path / "usr/lib" / version / "os.py").write_text("")
    (tmp_path / "usr/lib/python3").mkdir()  # Debian's version-less folder: no interpreter
    standins.install_path(tmp_path)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.pth"))
    assert written == [Path("usr/local/lib/python3.13/dist-packages/orchestrator-standins.pth")]
    target = tmp_path / standins.DIST_PACKAGES
    target.mkdir(parents=True)
    pth = tmp_path / written[0]
    assert pth.read_text() == f"/{standins.DIST_PACKAGES}\n" == "/usr/local/lib/python3.11/dist-packages\n"
    pth.write_text(str(target) + "\n")  # the host's absolute path, moved under tmp_path here
    monkeypatch.setattr(sys, "path", list(sys.path))
    site.addsitedir(str(pth.parent))
    assert str(target) in sys.path


def test_a_hosts_cgroup_is_made_under_the_cgroup2_mount_and_removed_deepest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
        f"cgroup2 {tmp_path / 'unified'} cgroup2 rw,nsdelegate 0 0\n"
    )
    real_path = Path

    def fake_path(arg: str = "", *rest: str) -> Path:
        return mounts if arg == "/proc/mounts" else real_path(arg, *rest)

    monkeypatch.setattr(nspawn, "Path", fake_path)
    monkeypatch.setattr(nspawn, "lab_dir", lambda: tmp_path / "lab")
    (tmp_path / "lab").mkdir()
    record = nspawn._Record({})
    made = real_path(nspawn._docker_cgroup(record, "lab1"))
    assert made == tmp_path / "unified" / nspawn.CGROUP_PARENT / "lab1" and made.is_dir()
    assert record.host("lab1")["cgroup"] == str(made)  # recorded: `down` removes it
    (made / "system.slice/docker-1.scope").mkdir(parents=True)  # what systemd and runc made in it
    stranger = tmp_path / "unified/other/lab1"
    stranger.mkdir(parents=True)
    assert nspawn._remove_cgroup("lab1", str(stranger)) == [
        f"lab1: recorded cgroup {stranger} is not this lab's {nspawn.CGROUP_PARENT}/lab1; left alone"
    ]
    assert stranger.is_dir()
    assert nspawn._remove_cgroup("lab1", str(made)) == []
    assert not (tmp_path / "unified" / nspawn.CGROUP_PARENT).exists()


def test_no_cgroup2_mount_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    real_path = Path
    monkeypatch.setattr(
        nspawn, "Path", lambda arg="", *rest: mounts if arg == "/proc/mounts" else real_path(arg, *rest)
    )
    monkeypatch.setattr(nspawn, "_check_tools", lambda: None)
    monkeypatch.setattr(nspawn, "_locked", None)  # `up` says so before it takes the lab's lock
    with pytest.raises(OrchestratorError) as err:
        nspawn.up(hosts=1, docker=True)
    assert str(err.value).startswith(
        "`lab up --docker` needs the unified cgroup hierarchy (cgroup2), and /proc/mounts has none: mount it"
    )
