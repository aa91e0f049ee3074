"""`adopt` from the command line, with the host's find play stood in by what sglang_adopt returns:
what is shown, written, refused and recorded. The play itself is tested in
tests/unit/modules/test_sglang_adopt.py and on the lab (tests/lab/test_adopt.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from orchestrator import ledger
from orchestrator.cli.main import cli
from orchestrator.hosts import adopt_play
from orchestrator.hosts.module_results import AdoptServer

NCCL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_NTHREADS": "512"}
FLAGS = [
    "--model-path",
    "/data/models/Kimi-K2.5",
    "--tp",
    "8",
    "--trust-remote-code",
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "/data/eagle3/output_10k_sglang/4",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "4",
    "--speculative-num-draft-tokens",
    "5",
]


def server(
    pid: int = 4242, flags: list[str] = FLAGS, env: dict[str, str] | None = None, **more: Any
) -> AdoptServer:
    environment = {**NCCL, "PWD": "/root", "SHLVL": "1", "SSH_CONNECTION": "10.0.0.9 5 10.0.0.1 22"}
    data = {
        "pid": pid,
        "ppid": 1,
        "uid": 0,
        "user": "root",
        "started": 1_700_000_000.0,
        "start_ticks": 9000 + pid,
        "argv": ["python3", "-m", "sglang.launch_server", *flags],
        "env": {**environment, **(env or {})},
        "secrets": {},
        "cwd": "/",
        "exe": "/usr/bin/python3.11",
        "home": "/root",
        "shell": "/bin/bash",
        "python": "/usr/bin/python3",
        "entry": "module",
        "ports": [30000],
        "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
        "launcher": {"kind": "nohup", "detail": "/data/x.log"},
        "unit": "",
        "ours": False,
        "log": "/data/x.log",
        "log_err": "/data/x.log",
        "container": {},
        **more,
    }
    return AdoptServer.model_validate(data)


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, adopt_play.Found]:
    """What the find play returns per host (fill it in); no play runs."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    hosts = "all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n"
    (tmp_path / "hosts.yml").write_text(hosts)
    found: dict[str, adopt_play.Found] = {}
    asked: list[dict[str, Any]] = []

    def find(inventory: Path, *, limit: str | None = None, port: int = 0, pid: int = 0) -> dict:
        asked.append({"limit": limit, "port": port, "pid": pid})
        return found

    monkeypatch.setattr(adopt_play, "find", find)
    monkeypatch.setattr(adopt_play, "record", _record(adopt_play.record, asked))
    found["_asked"] = asked  # type: ignore[assignment]
    return found


def _record(real: Any, asked: list) -> Any:
    def record(*args: Any) -> None:
        asked.append({"recorded": args[1]})
        real(*args)

    return record


def run(found: dict, *args: str) -> tuple[int, dict]:
    found.pop("_asked", None)
    done = CliRunner().invoke(cli, ["adopt", "-i", "hosts.yml", "--json", *args])
    assert "Traceback" not in done.output, done.output
    return done.exit_code, json.loads(done.stdout)


def test_check_maps_proves_and_writes_nothing(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found("gpu1", [server()], "0.5.9")
    rc, out = run(hosts, "--port", "30000", "--check", "-o", "hand.yml")
    assert rc == 0, out
    assert not Path("hand.yml").exists() and ledger.pending_adoption("gpu1", "sglang.service") is None
    prof = out["profile"]
    assert prof["server"]["tp_size"] == 8 and prof["speculative"]["algorithm"] == "EAGLE3"
    assert prof["nccl"] == NCCL and "PWD" not in prof.get("env", {})
    assert set(out["left_out"]) >= {"PWD", "SHLVL", "SSH_CONNECTION"}
    assert all(d["harmless"] for d in out["differences"]["gpu1"])
    assert any("--tp" in d["reason"] for d in out["differences"]["gpu1"])


def test_written_profile_loads_and_the_adoption_is_pending(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found("gpu1", [server()], "0.5.9")
    rc, out = run(hosts, "-o", "profiles/hand.yml")
    assert rc == 0, out
    assert out["written"] == "profiles/hand.yml"
    text = Path("profiles/hand.yml").read_text()
    assert text.startswith("# written by `orchestrator adopt`") and "gpu1 PID 4242" in text
    assert yaml.safe_load(text)["speculative"]["num_draft_tokens"] == 5
    row = ledger.pending_adoption("gpu1", "sglang.service")
    assert (row["pid"], row["start_ticks"], row["profile"]) == (4242, 13242, "hand")
    done = CliRunner().invoke(cli, ["adopt", "-i", "hosts.yml", "-o", "profiles/hand.yml"])
    assert done.exit_code == 2 and "profiles/hand.yml exists" in done.output  # never over a file


def test_a_flag_without_a_field_stays_in_extra_args(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found(
        "gpu1", [server(flags=[*FLAGS, "--chunked-prefill-size", "4096"])], "0.5.9"
    )
    rc, out = run(hosts, "--check")
    assert rc == 0, out
    assert out["profile"]["server"]["extra_args"] == ["--chunked-prefill-size", "4096"]


def test_secrets_name_files_and_never_reach_the_output(hosts: dict) -> None:
    flags = [*FLAGS, "--api-key", "<secret>"]
    seen = server(
        flags=flags, env={"HF_TOKEN": "<secret>"}, secrets={"--api-key": "a" * 64, "HF_TOKEN": "b" * 64}
    )
    hosts["gpu1"] = adopt_play.Found("gpu1", [seen], "0.5.9")
    rc, out = run(hosts, "-o", "profiles/keyed.yml")
    assert rc == 0, out
    text = Path("profiles/keyed.yml").read_text()
    assert "<secret>" not in text and "a" * 64 not in text and "b" * 64 not in text
    assert set(out["secret_files"]) == {"--api-key", "HF_TOKEN"}
    prof = yaml.safe_load(text)
    assert prof["api_key"]["file"] == out["secret_files"]["--api-key"]


def test_two_servers_on_a_host_need_a_port(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(4242), server(4343, ports=[30001])], "0.5.9")
    rc, out = run(hosts, "--check")
    assert rc == 2
    assert any("gpu1 runs 2 SGLang servers" in p and "--port or --pid" in p for p in out["problems"]), out


def test_nothing_found_and_a_host_not_read_are_said(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found("gpu1", [], "0.5.9")
    rc, out = run(hosts, "--port", "30005", "--check")
    assert rc == 2 and out["problems"] == ["no SGLang server found listening on port 30005"]
    hosts["gpu1"] = adopt_play.Found("gpu1", error="unreachable")
    rc, out = run(hosts, "--check")
    assert rc == 2 and out["problems"] == ["gpu1: not read: unreachable"]


def test_a_flag_the_hosts_version_lacks_is_a_problem_and_nothing_is_written(hosts: dict) -> None:
    newer = [*FLAGS, "--cuda-graph-max-bs-decode", "64"]  # 0.5.20 on; the host runs 0.5.9
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(flags=newer)], "0.5.9")
    rc, out = run(hosts, "-o", "newer.yml")
    assert rc == 2 and not Path("newer.yml").exists()
    assert ledger.pending_adoption("gpu1", "sglang.service") is None
    assert any("--cuda-graph-max-bs-decode" in p for p in out["problems"]), out


def test_a_multi_node_server_is_refused_and_nothing_is_written(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(flags=[*FLAGS, "--nnodes", "2"])], "0.5.9")
    rc, out = run(hosts, "-o", "multi.yml")
    assert rc == 2 and not Path("multi.yml").exists()
    assert any("nnodes" in p for p in out["problems"]), out


def test_a_server_in_a_container_or_on_a_deployed_unit_name_is_refused(hosts: dict) -> None:
    boxed = server(container={"engine": "docker", "id": "0123456789abcdef", "name": "sg", "image": "x"})
    hosts["gpu1"] = adopt_play.Found("gpu1", [boxed], "0.5.9")
    rc, out = run(hosts, "--check")
    assert rc == 2 and any("runs in docker container 0123456789ab" in p for p in out["problems"]), out
    hosts["gpu1"] = adopt_play.Found("gpu1", [server()], "0.5.9", units=["sglang.service"])
    rc, out = run(hosts, "--check")
    assert rc == 2 and any("sglang.service is already an orchestrator unit" in p for p in out["problems"])


def test_two_hosts_with_different_secrets_are_two_profiles(hosts: dict, monkeypatch) -> None:
    flags = [*FLAGS, "--api-key", "<secret>"]
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(flags=flags, secrets={"--api-key": "a" * 64})], "0.5.9")
    hosts["gpu2"] = adopt_play.Found("gpu2", [server(flags=flags, secrets={"--api-key": "b" * 64})], "0.5.9")
    rc, out = run(hosts, "--check")
    assert rc == 2 and any("gpu2's --api-key is not gpu1's" in p for p in out["problems"]), out


def test_a_secret_file_with_another_value_is_refused(hosts: dict) -> None:
    import hashlib

    flags = [*FLAGS, "--api-key", "<secret>"]
    live = hashlib.sha256(b"the-real-key").hexdigest()
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(flags=flags, secrets={"--api-key": live})], "0.5.9")
    rc, out = run(hosts, "--check", "-o", "keyed.yml")
    where = Path(out["secret_files"]["--api-key"])
    where.parent.mkdir(parents=True)
    where.write_text("a-typo-key\n")
    where.chmod(0o600)
    rc, out = run(hosts, "-o", "keyed.yml")
    assert rc == 2 and not Path("keyed.yml").exists()
    assert any("does not hold the --api-key the server runs with" in p for p in out["problems"]), out
    where.write_text("the-real-key\n")
    rc, out = run(hosts, "-o", "keyed.yml")
    assert rc == 0, out
    assert "a" * 64 not in json.dumps(out) and live not in json.dumps(out)  # names only, never a sha


def test_take_over_without_its_secret_files_writes_nothing(hosts: dict) -> None:
    flags = [*FLAGS, "--api-key", "<secret>"]
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(flags=flags, secrets={"--api-key": "a" * 64})], "0.5.9")
    rc, out = run(hosts, "-o", "keyed.yml", "--take-over")
    assert rc == 2 and not Path("keyed.yml").exists()
    assert any(p.startswith("create secrets/") and "then run again" in p for p in out["problems"]), out


def test_a_server_of_someone_elses_unit_is_written_but_never_taken_over(hosts: dict) -> None:
    theirs = server(unit="team-sglang.service", launcher={"kind": "unit", "detail": "team-sglang.service"})
    hosts["gpu1"] = adopt_play.Found("gpu1", [theirs], "0.5.9")
    rc, out = run(hosts, "-o", "theirs.yml", "--take-over")
    assert rc == 2 and not Path("theirs.yml").exists()
    assert any("systemctl disable --now team-sglang.service" in p for p in out["problems"]), out
    rc, out = run(hosts, "-o", "theirs.yml")
    assert rc == 0 and Path("theirs.yml").exists()
    assert ledger.pending_adoption("gpu1", "sglang.service") is None  # no deploy signals it


def test_check_and_take_over_together_are_refused_before_any_play(hosts: dict) -> None:
    done = CliRunner().invoke(cli, ["adopt", "-i", "hosts.yml", "--check", "--take-over"])
    assert done.exit_code == 2 and "give one of them" in done.output


def test_a_server_bound_to_cpus_is_noted_with_the_line_that_keeps_it(hosts: dict) -> None:
    hosts["gpu1"] = adopt_play.Found("gpu1", [server(cpus_allowed="0-31")], "0.5.9")
    rc, out = run(hosts, "--check")
    assert rc == 0, out
    assert any("CPUs 0-31 only" in n and "CPUAffinity: '0-31'" in n for n in out["notes"]), out["notes"]


@pytest.mark.parametrize(
    "args", [["--name", "../x"], ["--name", "a b"], ["--name", "x\ny"], ["-o", "a b.yml"]]
)
def test_a_name_that_is_no_profile_name_is_refused_before_any_play(hosts: dict, args: list[str]) -> None:
    asked = hosts.pop("_asked")
    done = CliRunner().invoke(cli, ["adopt", "-i", "hosts.yml", "--check", *args])
    assert done.exit_code == 2 and "is not a profile name" in done.output, done.output
    assert "Traceback" not in done.output and asked == []  # no host was asked
