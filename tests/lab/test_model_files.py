"""Model files on real lab hosts (issue #41): a start that cannot fit in GPU memory is refused
before anything stops, with the numbers; a drafter that differs on one host stops a multi-host
deploy or a campaign before it starts; the server's own memory lines are recorded and shown
against the next prediction.

The lab's model directories hold real safetensors headers over sparse files (the stand-in
installer writes them): the fit reads the same headers SGLang's loader would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from labutil import GOOD, deploy_json, gpu_count, on_good, orchestrator, service, ssh, write_profile
from orchestrator.paths import ROOT

pytestmark = pytest.mark.lab

DRAFTER = "/data/eagle3/output_10k_sglang/4"
#: A copy of the drafter made for these tests on both hosts; one host's copy is then changed.
COPY = "/data/eagle3/test-copy"


def profile_with(tmp_path: Path, name: str, doc: dict) -> str:
    return write_profile(tmp_path, name, yaml.safe_dump(doc))


def test_base_at_tp4_on_4_gpus_is_refused_before_the_stop_with_the_numbers(lab, tmp_path):
    host = on_good(lab)
    before = service(host)
    ref = profile_with(tmp_path, "base_tp4", {"extends": "base", "server": {"tp_size": 4}})
    with gpu_count(host, 4):
        rc, report = deploy_json(lab, "--profile", ref, "--limit", host.name)
        done = orchestrator("preflight", "-i", str(lab.inventory), "--limit", host.name, "--profile", ref)
    assert rc == 1, report
    (h,) = report["hosts"]
    assert h["step"] == "preflight" and "nothing was stopped" in h["diagnosis"], h
    assert service(host) == before  # the old server still runs, untouched
    line, fix = [p for p in h["problems"] if p.startswith("memory: ")]
    print(line, fix, sep="\n")
    assert "weights 140.79 GiB per GPU at TP 4 > 137.31 GiB free on each GPU of 140.40 GiB" in line
    assert fix.startswith("memory: what would fit: tp_size 8 fits, on 8 GPUs (this host has 4)"), fix
    assert done.returncode == 1
    assert f"{host.name}: memory: weights 140.79 GiB per GPU at TP 4" in done.stdout, done.stdout


@contextmanager
def drafter_copies(hosts, changed) -> Iterator[None]:
    """COPY on every host as a sparse copy of the drafter; on `changed` its last byte differs (a
    sampled offset: the content digest reads it)."""
    for h in hosts:
        ssh(h, f"rm -rf {COPY} && cp -a --sparse=always {DRAFTER} {COPY}")
    weights = f"{COPY}/model.safetensors"
    ssh(changed, f"printf 'x' | dd of={weights} bs=1 seek=$(($(stat -c %s {weights}) - 1)) conv=notrunc")
    try:
        yield
    finally:
        for h in hosts:
            ssh(h, f"rm -rf {COPY}")


def test_a_drafter_that_differs_on_one_host_stops_a_deploy_and_a_campaign(lab, tmp_path):
    one, two = lab.hosts[0], lab.hosts[1]
    for h in (one, two):
        rc, report = deploy_json(lab, "--profile", GOOD, "--limit", h.name)
        assert rc == 0, report
    before = {h.name: service(h) for h in (one, two)}
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in ("base", GOOD, "baseline"):
        (folder / f"{name}.yml").write_text((ROOT / "profiles" / f"{name}.yml").read_text())
    ref = profile_with(folder, "copy", {"extends": GOOD, "speculative": {"draft_model_path": COPY}})
    space = tmp_path / "space.yml"
    space.write_text(
        yaml.safe_dump(
            {
                "extends": "copy",
                "baseline": "baseline",
                "vary": {"speculative.num_steps": [2, 3]},
                "traffic": {"concurrency": [1], "requests": 2, "max_tokens": 8},
                "budget": {"restarts": 3},
            }
        )
    )
    limit = f"{one.name},{two.name}"
    with drafter_copies((one, two), two):
        deploy = orchestrator("deploy", "-i", str(lab.inventory), "--limit", limit, "--profile", ref)
        tune = orchestrator(
            "--profiles-dir", str(folder), "tune", str(space), "-i", str(lab.inventory), "--limit", limit
        )
    for done in (deploy, tune):
        said = " ".join((done.stdout + done.stderr).split())
        print(said)
        assert done.returncode != 0, said
        assert f"{two.name}: speculative.draft_model_path: " in said, said
        assert "model.safetensors" in said and "nothing was stopped" in said, said
    assert {h.name: service(h) for h in (one, two)} == before


def test_the_servers_memory_lines_are_recorded_and_preflight_shows_them(lab, tmp_path):
    host = lab.hosts[0]
    rc, report = deploy_json(lab, "--profile", GOOD, "--limit", host.name, "--force-restart")
    assert rc == 0, report
    (h,) = report["hosts"]
    measured, predicted = h["memory"]["measured"], h["memory"]["predicted"]
    print(json.dumps(h["memory"], indent=1)[:2000])
    assert measured["weights_mib"] > 0 and measured["kv_tokens"] > 0, measured
    assert predicted["weights_mib"] > 0 and predicted["kv_tokens"] > 0, predicted
    assert h["model_digest"].startswith("model:") and "+draft:" in h["model_digest"]
    preflight = ("preflight", "-i", str(lab.inventory), "--limit", host.name, "--profile", GOOD)
    done = orchestrator(*preflight, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (fit,) = [r["memory"] for r in json.loads(done.stdout)]
    assert fit["calibrated"] and fit["last_measured"]["kv_tokens"] == measured["kv_tokens"], fit
    assert abs(fit["weights_mib"] - measured["weights_mib"]) <= 1  # the next fit starts from what was logged
    table = orchestrator(*preflight)
    assert f"{measured['kv_tokens']:,}" in table.stdout and "last measured" in table.stdout, table.stdout
