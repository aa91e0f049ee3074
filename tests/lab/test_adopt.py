"""adopt on lab hosts: a server started by hand, with the reference deployment's own compound
command, is found, written as a profile that renders the same, and taken over by the unit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from labutil import GOOD, cmdline, deploy_json, orchestrator, service, ssh
from orchestrator.profile import sglang_flags

pytestmark = pytest.mark.lab

#: The reference deployment's restart (the issue's), with the lab's paths: stop what runs, free the
#: GPUs, then the server under nohup with its NCCL variables, its log in the drafter's folder.
NCCL = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MIN_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
FLAGS = (
    "--model-path /data/models/Kimi-K2.5 --served-model-name kimi-k2.5 --tp 8 --host 0.0.0.0 "
    "--port 30000 --trust-remote-code --speculative-algorithm EAGLE3 "
    "--speculative-draft-model-path /data/eagle3/output_10k_sglang/4 --speculative-num-steps 3 "
    "--speculative-eagle-topk 4 --speculative-num-draft-tokens 5"
)
LOG = "/data/eagle3/sglang_eagle3_cg_5tok.log"
#: pkill's pattern for the servers (a unit's and a hand-started one), never a shell naming them.
SERVERS = "'^[^ ]*python3 -m sglang[.]launch_server'"


def hand_start(host, flags: str = FLAGS) -> str:
    """Start the server as the reference deployment did; its PID once it answers /health."""
    variables = " ".join(f"{k}={v}" for k, v in NCCL.items())
    line = (
        # Anchored: `pkill -f sglang.launch_server` matches this very shell's command line and ends
        # the chain (the reference deployment's silent "crash": its log was never created).
        f"pkill -f {SERVERS}; sleep 1; fuser -k /dev/nvidia* 2>/dev/null; sleep 1; "
        f"cd /data/eagle3; {variables} nohup python3 -m sglang.launch_server {flags} > {LOG} 2>&1 &"
    )
    ssh(host, "bash", "-c", line)
    return wait_healthy(host)


def wait_healthy(host, timeout_s: float = 120) -> str:
    """The PID of the hand-started server once /health answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = ssh(
            host, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health || true"
        ).strip()
        if code == "200":
            return hand_pid(host)
        time.sleep(0.5)
    raise AssertionError(f"the hand-started server did not answer: {ssh(host, f'tail -5 {LOG}')}")


def hand_pid(host) -> str:
    """The hand-started server's PID ('' when none runs): the launch_server process outside any unit."""
    for pid in ssh(host, f"pgrep -f {SERVERS} || true").split():
        cgroup = ssh(host, f"cat /proc/{pid}/cgroup 2>/dev/null || true")
        if "sglang.service" not in cgroup and cmdline(host, pid)[1:3] == ["-m", "sglang.launch_server"]:
            return pid
    return ""


def environ(host, pid: str) -> dict[str, str]:
    raw = ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def parsed(version: str, argv: list[str]) -> dict:
    """What SGLang's argparse makes of an argv (after `python -m sglang.launch_server`)."""
    parser = sglang_flags.build_parser(sglang_flags.flag_table(version))
    return vars(parser.parse_args(argv[3:]))


@pytest.fixture
def hand(lab):
    """lab3 with no unit running, for a server started by hand; afterwards it runs GOOD again
    under the unit, and no hand-started server is left."""
    host = lab.hosts[2]
    done = orchestrator("stop", "-i", str(lab.inventory), "--limit", host.name)
    assert done.returncode == 0, done.stdout + done.stderr
    yield host
    ssh(host, f"pkill -f {SERVERS} || true")
    rc, report = deploy_json(lab, "--profile", GOOD, "--limit", host.name, "--force-restart")
    assert rc == 0, report


def adopt(lab, host, *args: str) -> tuple[int, dict]:
    done = orchestrator("adopt", "-i", str(lab.inventory), "--limit", host.name, "--json", *args)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}") from None


def test_the_reference_command_is_adopted_and_taken_over_with_the_same_argv(lab, hand, tmp_path):
    pid = hand_start(hand)
    live_argv, live_env = cmdline(hand, pid), environ(hand, pid)
    out = tmp_path / "hand.yml"

    rc, checked = adopt(lab, hand, "--port", "30000", "--check", "-o", str(out))
    assert rc == 0, checked
    assert not out.exists()  # --check writes nothing
    seen = checked["servers"][hand.name]
    assert seen["pid"] == int(pid) and seen["log"] == LOG and seen["launcher"]["kind"] == "nohup"
    assert all(d["harmless"] for d in checked["differences"][hand.name]), checked["differences"]
    # status names the server the tool did not start
    status = json.loads(
        orchestrator("status", "-i", str(lab.inventory), "--limit", hand.name, "--json").stdout
    )
    assert any(row["foreign"].get("pid") == int(pid) for row in status), status

    rc, report = adopt(lab, hand, "--port", "30000", "--take-over", "-o", str(out))
    assert rc == 0, report
    prof = yaml.safe_load(out.read_text())
    assert prof["speculative"]["algorithm"] == "EAGLE3"
    assert {k: str(v) for k, v in prof["nccl"].items()} == NCCL
    (h,) = report["hosts"]
    assert h["ok"] and h["takeover"]["taken"] and h["takeover"]["log"] == LOG, h

    # the unit runs what the hand started: the same options for SGLang's argparse, the same NCCL
    unit_pid = service(hand)["MainPID"]
    unit_argv, unit_env = cmdline(hand, unit_pid), environ(hand, unit_pid)
    assert parsed("0.5.9", unit_argv) == parsed("0.5.9", live_argv)
    assert {k: v for k, v in unit_env.items() if k.startswith("NCCL_")} == NCCL
    assert {k: v for k, v in live_env.items() if k.startswith("NCCL_")} == NCCL
    assert hand_pid(hand) == ""  # the nohup process is gone
    done = orchestrator("verify", "-i", str(lab.inventory), "--limit", hand.name, "--profile", str(out))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_flag_without_a_field_is_kept_in_extra_args_through_the_take_over(lab, hand, tmp_path):
    hand_start(hand, FLAGS + " --chunked-prefill-size 4096 --schedule-policy lpm")
    out = tmp_path / "extra.yml"
    rc, report = adopt(lab, hand, "-o", str(out))
    assert rc == 0, report
    prof = yaml.safe_load(out.read_text())
    assert prof["server"]["extra_args"] == ["--chunked-prefill-size", "4096", "--schedule-policy", "lpm"]

    rc, deployed = deploy_json(lab, "--profile", str(out), "--limit", hand.name)  # a plain deploy takes over
    assert rc == 0, deployed
    assert deployed["hosts"][0]["takeover"]["taken"]
    argv = cmdline(hand, service(hand)["MainPID"])
    assert argv[-4:] == ["--chunked-prefill-size", "4096", "--schedule-policy", "lpm"]
    assert hand_pid(hand) == ""


def test_a_take_over_whose_unit_fails_starts_the_hand_command_again(lab, hand, tmp_path):
    old = hand_start(hand)
    before = cmdline(hand, old)
    out = tmp_path / "short.yml"
    rc, report = adopt(lab, hand, "-o", str(out))
    assert rc == 0, report
    # The unit gets one second to answer /health: the stand-in takes longer, so the unit fails.
    prof = yaml.safe_load(out.read_text())
    prof.setdefault("service", {})["health_timeout_s"] = 1
    out.write_text(yaml.safe_dump(prof, sort_keys=False))

    rc, deployed = deploy_json(lab, "--profile", str(out), "--limit", hand.name)
    assert rc == 1, deployed
    (h,) = deployed["hosts"]
    assert h["takeover"]["taken"] and h["relaunched"]["healthy"], h
    assert "the hand command, started again" in h["rolled_back_to"]
    again = hand_pid(hand)
    assert again and again != old
    assert cmdline(hand, again) == before  # the very command, as it ran
    assert service(hand)["ActiveState"] in ("inactive", "failed")
    assert Path(LOG).name in ssh(hand, "ls /data/eagle3")
