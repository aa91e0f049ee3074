"""runtime.kind docker and podman (#17, the lab-free slice): the unit a container profile renders
to, and the commands that refuse it (all of them for docker; all but deploy for podman).

The validation messages are cases in tests/data/profile_cases/ (runtime_*.yml); systemd's own
reading of these units is in test_systemd_oracle.py, the real docker and podman CLIs' in
test_container_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.hosts import secrets
from orchestrator.profile import model as profile_mod
from orchestrator.render import container_unit, launch

DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64@{DIGEST}"


def _load(tmp_path: Path, doc: dict[str, Any], name: str = "p") -> profile_mod.Profile:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return profile_mod.load(str(path))


def _doc(kind: str, **runtime: Any) -> dict[str, Any]:
    return {"extends": "cg_5tok", "runtime": {"kind": kind, "image": IMAGE, **runtime}}


def _line(unit: str, directive: str) -> list[str]:
    return [line.partition("=")[2] for line in unit.splitlines() if line.startswith(f"{directive}=")]


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_the_argv_in_the_container_is_the_host_runtimes(kind: str, tmp_path: Path) -> None:
    doc = {
        "extends": "cg_5tok",
        "api_key": {"env": "SGLANG_KEY"},
        "server": {"extra_args": ["--max-running", "8"]},
    }
    host_prof = _load(tmp_path, doc, "host")
    ctr_prof = _load(tmp_path, {**doc, "runtime": {"kind": kind, "image": IMAGE}}, "ctr")
    host, ctr = launch.build(host_prof), launch.build(ctr_prof)
    assert ctr.argv == host.argv
    assert ctr.exec_argv == [*ctr.engine_argv, *host.argv]
    assert ctr.engine_argv[:2] == [container_unit.ENGINES[kind], "run"] and ctr.engine_argv[-1] == IMAGE
    assert launch.parse_unit(ctr.unit) == (host.argv, ctr.environment)
    # A multi-node rank: its own flags, in the same place as on the host.
    node = launch.Node(rank=1, nnodes=2, dist_init_addr="10.0.0.1:5757")
    assert launch.build(ctr_prof, node).argv == launch.build(host_prof, node).argv


def test_podman_unit_is_podmans_systemd_integration(tmp_path: Path) -> None:
    prof = _load(tmp_path, _doc("podman"))
    p = launch.build(prof)
    unit = p.unit
    assert "# runtime: podman: podman 4.3 or later" in unit
    assert _line(unit, "Type") == ["notify"] and _line(unit, "NotifyAccess") == ["all"]
    assert _line(unit, "Delegate") == ["yes"] and _line(unit, "KillMode") == ["mixed"]
    for word in (
        "--rm",
        "--replace",
        "-d",
        "--sdnotify=conmon",
        "--cgroups=split",
        "--log-driver=passthrough",
    ):
        assert word in p.engine_argv
    assert "--name=sglang" in p.engine_argv and "--label=orchestrator.unit=sglang.service" in p.engine_argv
    assert _line(unit, "ExecStop") == ["/usr/bin/podman stop --ignore -t 60 sglang"]
    assert _line(unit, "ExecStopPost") == ["-/usr/bin/podman rm -f --ignore sglang"]
    assert _line(unit, "TimeoutStopSec") == [str(60 + container_unit.STOP_MARGIN_S)]
    assert _line(unit, "SuccessExitStatus") == ["143"] and _line(unit, "SyslogIdentifier") == ["sglang"]
    assert _line(unit, "ExecStartPre") == []


def test_docker_unit_runs_the_client_in_the_foreground(tmp_path: Path) -> None:
    doc = _doc("docker")
    doc["service"] = {"unit_name": "sglang-b.service", "stop_timeout_s": 30}
    p = launch.build(_load(tmp_path, doc))
    unit = p.unit
    assert _line(unit, "Type") == ["exec"] and _line(unit, "KillMode") == ["control-group"]
    assert _line(unit, "NotifyAccess") == [] and _line(unit, "Delegate") == []
    assert "-d" not in p.engine_argv and "--detach" not in p.engine_argv
    assert _line(unit, "ExecStartPre") == ["-/usr/bin/docker rm -f sglang-b"]
    assert _line(unit, "ExecStop") == ["-/usr/bin/docker stop -t 30 sglang-b"]
    assert "--name=sglang-b" in p.engine_argv
    assert "--label=orchestrator.unit=sglang-b.service" in p.engine_argv


def test_gpus_come_from_server_gpus_or_the_default_set(tmp_path: Path) -> None:
    doc = _doc("docker")
    doc["server"] = {"tp_size": 4, "gpus": "4-7"}
    docker = launch.build(_load(tmp_path, doc, "d"))
    assert '--gpus="device=4,5,6,7"' in docker.engine_argv
    assert "CUDA_VISIBLE_DEVICES" not in docker.environment  # the container sees them as 0 to 3
    assert "CUDA_VISIBLE_DEVICES" not in docker.unit
    doc["runtime"]["kind"] = "podman"
    podman = launch.build(_load(tmp_path, doc, "p"))
    devices = [w for w in podman.engine_argv if w.startswith("--device=")]
    assert devices == [f"--device=nvidia.com/gpu={i}" for i in (4, 5, 6, 7)]
    default = launch.build(_load(tmp_path, _doc("podman"), "default"))  # TP 8, no server.gpus
    assert [w for w in default.engine_argv if w.startswith("--device=")] == [
        f"--device=nvidia.com/gpu={i}" for i in range(8)
    ]
    multinode = _load(tmp_path, {**_doc("docker"), "server": {"tp_size": 16}}, "two")
    rank = launch.build(multinode, launch.Node(rank=1, nnodes=2, dist_init_addr="10.0.0.1:5757"))
    assert '--gpus="device=0,1,2,3,4,5,6,7"' in rank.engine_argv  # one node's share
    doc["runtime"] = {"kind": "docker", "image": IMAGE, "gpu_devices": "cdi"}
    cdi = launch.build(_load(tmp_path, doc, "cdi"))  # docker with CDI devices: podman's words
    assert [w for w in cdi.engine_argv if "gpu" in w] == [
        f"--device=nvidia.com/gpu={i}" for i in (4, 5, 6, 7)
    ]
    doc["runtime"]["gpu_devices"] = "gpus"
    assert launch.build(_load(tmp_path, doc, "gpus")).engine_argv == docker.engine_argv


def test_environment_reaches_the_container_not_the_engine(tmp_path: Path) -> None:
    doc = _doc("podman")
    doc["env"] = {"SGLANG_X": "a b $HOME"}
    doc["secret_env"] = {"HF_TOKEN": {"env": "HF_TOKEN"}}
    p = launch.build(_load(tmp_path, doc))
    assert p.environment["NCCL_PROTO"] == "LL" and p.environment["SGLANG_X"] == "a b $HOME"
    assert [w for w in p.engine_argv if w.startswith("--env=")] == [
        f"--env={k}={v}" for k, v in p.environment.items()
    ]
    assert _line(p.unit, "Environment") == [] and _line(p.unit, "EnvironmentFile") == []
    assert "--env-file=/etc/orchestrator/sglang.env" in p.engine_argv
    assert '"--env=SGLANG_X=a b $$HOME"' in p.unit  # quoted for systemd like every ExecStart= word
    assert "HF_TOKEN" not in p.unit


def test_secret_env_file_is_written_in_the_engines_syntax(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--env-file takes `NAME=value` literally: systemd's quotes would reach the server."""
    monkeypatch.setenv("HF_TOKEN", 'hf_a"b$c')
    doc = _doc("docker")
    doc["secret_env"] = {"HF_TOKEN": {"env": "HF_TOKEN"}}
    assert secrets.secret_env_text(_load(tmp_path, doc, "ctr")) == 'HF_TOKEN=hf_a"b$c\n'
    del doc["runtime"]
    assert secrets.secret_env_text(_load(tmp_path, doc, "host")) == 'HF_TOKEN="hf_a\\"b\\$c"\n'


def test_model_drafter_mounts_and_the_api_key(tmp_path: Path) -> None:
    doc = _doc("docker")
    doc["runtime"]["mounts"] = [
        {"source": "/data/hf", "target": "/root/.cache/huggingface", "read_only": False},
        {"source": "/etc/site", "target": "/etc/site"},
    ]
    doc["api_key"] = {"env": "SGLANG_KEY"}
    p = launch.build(_load(tmp_path, doc))
    volumes = [w for w in p.engine_argv if w.startswith("--volume=")]
    assert volumes == [
        "--volume=/data/models/Kimi-K2.5:/data/models/Kimi-K2.5:ro",
        "--volume=/data/eagle3/output_10k_sglang/4:/data/eagle3/output_10k_sglang/4:ro",
        "--volume=/var/cache/orchestrator/sglang:/var/cache/orchestrator/sglang",  # the compile caches
        "--volume=/data/hf:/root/.cache/huggingface",
        "--volume=/etc/site:/etc/site:ro",
        "--volume=/etc/orchestrator/sglang.config.yaml:/run/credentials/sglang.service/sglang-config.yaml:ro",
    ]
    # systemd still loads the credential, so that it expands ${CREDENTIALS_DIRECTORY} in the argv
    # to /run/credentials/sglang.service: where the key's file is mounted in the container.
    assert _line(p.unit, "LoadCredential") == ["sglang-config.yaml:/etc/orchestrator/sglang.config.yaml"]
    assert p.argv[-2:] == ["--config", launch.CREDENTIAL_ARG]
    same = _doc("podman")
    same["speculative"] = {"draft_model_path": "/data/models/Kimi-K2.5"}
    volumes = [
        w for w in launch.build(_load(tmp_path, same, "same")).engine_argv if w.startswith("--volume=")
    ]
    assert volumes == [
        "--volume=/data/models/Kimi-K2.5:/data/models/Kimi-K2.5:ro",
        "--volume=/var/cache/orchestrator/sglang:/var/cache/orchestrator/sglang",
    ]
    # Written otherwise, it is still one mount point to the engines (podman: "duplicate mount
    # destination"), so it is mounted once, as the model path is written.
    same["speculative"] = {"draft_model_path": "/data/models//Kimi-K2.5/."}
    volumes = [
        w for w in launch.build(_load(tmp_path, same, "same")).engine_argv if w.startswith("--volume=")
    ]
    assert volumes == [
        "--volume=/data/models/Kimi-K2.5:/data/models/Kimi-K2.5:ro",
        "--volume=/var/cache/orchestrator/sglang:/var/cache/orchestrator/sglang",
    ]


def test_limits_and_options_become_run_options(tmp_path: Path) -> None:
    doc = _doc("podman", ipc_host=False, shm_size="32g", pull="never")
    doc["runtime"]["options"] = ["--cap-add IPC_LOCK", "--init", "--ulimit=core=0"]
    doc["service"] = {"limits": {"memlock": "64G", "nofile": 65536}}
    p = launch.build(_load(tmp_path, doc))
    assert "--ipc=host" not in p.engine_argv and "--shm-size=32g" in p.engine_argv
    assert "--pull=never" in p.engine_argv and "--network=host" in p.engine_argv
    assert f"--ulimit=memlock={64 * 2**30}:{64 * 2**30}" in p.engine_argv
    assert "--ulimit=nofile=65536:65536" in p.engine_argv
    assert p.engine_argv[-4:] == ["--cap-add=IPC_LOCK", "--init", "--ulimit=core=0", IMAGE]


def test_host_runtime_is_todays_unit(tmp_path: Path) -> None:
    """`runtime: {kind: host}` is the default, and every shipped profile renders without a trace of it."""
    for name in profile_mod.available():
        default = launch.build(profile_mod.load(name))
        explicit = launch.build(_load(tmp_path, {"extends": name, "runtime": {"kind": "host"}}, name))
        assert explicit.unit.replace(f"profile: {name}", "") == default.unit.replace(f"profile: {name}", "")
        assert (
            "runtime" not in default.unit and default.engine_argv == [] and default.exec_argv == default.argv
        )
        assert set(default.to_json()) == {"argv", "environment", "unit"}


def test_render_json_and_against_for_containers(tmp_path: Path) -> None:
    path = tmp_path / "ctr.yml"
    path.write_text(yaml.safe_dump(_doc("docker")))
    result = CliRunner().invoke(cli, ["render", "-p", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["argv"] == launch.build(profile_mod.load("cg_5tok")).argv
    assert data["engine_argv"][0] == "/usr/bin/docker" and data["engine_argv"][-1] == IMAGE
    other = tmp_path / "ctr2.yml"
    other.write_text(yaml.safe_dump({**_doc("docker"), "extends": "cg_2step"}))
    result = CliRunner().invoke(cli, ["render", "-p", str(other), "--against", str(path)])
    assert result.stdout == "ctr -> ctr2: 1 change(s)\n  --speculative-num-steps: 3 -> 2\n"


def test_a_tag_without_digest_is_a_note(tmp_path: Path) -> None:
    tag_only = tmp_path / "tag.yml"
    tag_only.write_text(yaml.safe_dump(_doc("podman", image="docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64")))
    pinned = tmp_path / "pinned.yml"
    pinned.write_text(yaml.safe_dump(_doc("podman")))
    for command in ("render", "validate"):
        result = CliRunner().invoke(cli, [command, "-p", str(tag_only)])
        assert result.exit_code == 0, result.output
        (note,) = result.stderr.splitlines()
        assert note.startswith("note: ") and "is pinned by tag only" in note and "@sha256:" in note
        result = CliRunner().invoke(cli, [command, "-p", str(pinned)])
        assert result.exit_code == 0 and result.stderr == "", result.stderr
    assert CliRunner().invoke(cli, ["render", "-p", str(tag_only)]).stdout.startswith("# Managed")


def test_podman_cgroups_disabled_keeps_the_container_in_the_units_cgroup(tmp_path: Path) -> None:
    """runtime.cgroups: split (the default) delegates sub-cgroups; disabled makes none, so no
    Delegate= (a systemd-nspawn host with cgroup v1 read-only, as the lab's)."""
    split = launch.build(_load(tmp_path, _doc("podman"))).unit
    assert "--cgroups=split" in split and _line(split, "Delegate") == ["yes"]
    disabled = launch.build(_load(tmp_path, _doc("podman", cgroups="disabled"))).unit
    assert "--cgroups=disabled" in disabled and _line(disabled, "Delegate") == []
    assert "# runtime: podman: podman 4.3 or later (--sdnotify=conmon, --cgroups=disabled," in disabled


def test_every_limit_systemd_takes_is_the_same_number_as_a_ulimit(tmp_path: Path) -> None:
    """#21 (review): memlock 1P was a ValueError (K to T only)."""
    path = tmp_path / "p.yml"
    path.write_text(
        "extends: cg_5tok\nservice: {limits: {memlock: 1P, nofile: 65536}}\n"
        "runtime: {kind: podman, image: 'docker.io/lmsysorg/sglang:v0.5.9'}\n"
    )
    words = launch.build(profile_mod.load(str(path))).engine_argv
    assert f"--ulimit=memlock={2**50}:{2**50}" in words and "--ulimit=nofile=65536:65536" in words
