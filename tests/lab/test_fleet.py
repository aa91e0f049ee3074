"""A fleet of replicas: rolling deploys keep the rest serving; a slower canary stops the rollout."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest

from labutil import deploy_json, orchestrator, service, ssh

pytestmark = pytest.mark.lab


def healthy(host) -> bool:
    """Serving: /health answers 200. A slow answer on a busy CI machine is still up; a refused
    connection or an error status is down."""
    try:
        return urllib.request.urlopen(f"http://{host.address}:30000/health", timeout=5).status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.parametrize(("serial", "most_down"), [("1", 1), ("50%", 2)])
def test_rolling_deploy_over_4_replicas_never_has_more_than_n_down(lab, serial, most_down):
    if len(lab.hosts) < 4:
        pytest.skip("needs 4 lab hosts")
    names = ",".join(h.name for h in lab.hosts)
    rc, _ = deploy_json(lab, "--profile", "baseline", "--limit", names)
    assert rc == 0
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(sum(not healthy(h) for h in lab.hosts))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rc, report = deploy_json(lab, "--profile", "cg_5tok", "--limit", names, "--serial", serial)
    finally:
        done.set()
        sampler.join()
    assert rc == 0, report
    assert all(h["restarted"] for h in report["hosts"])
    assert 1 <= max(samples) <= most_down, f"replicas down at once, per sample: {samples}"
    assert len(samples) > 20


def test_a_slower_canary_is_rejected_and_the_fleet_stays_on_the_old_profile(lab):
    fleet = lab.hosts[1:]
    limit = ",".join(h.name for h in fleet)
    rc, _ = deploy_json(lab, "--profile", "baseline", "--limit", limit)
    assert rc == 0
    untouched = [service(h) for h in fleet[1:]]
    # 16 draft tokens without CUDA graphs: 53.2 tok/s against baseline's 90 in the stand-in's model
    done = orchestrator(
        "deploy", "-i", str(lab.inventory), "--limit", limit, "-p", "eagle3_16tok_nocg", "--canary"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"canary {fleet[0].name}: " in done.stderr and "REJECTED" in done.stderr, done.stderr
    assert "# profile: baseline" in ssh(fleet[0], "cat", "/etc/systemd/system/sglang.service")
    assert healthy(fleet[0])
    assert all(service(h) == before for h, before in zip(fleet[1:], untouched, strict=True))
