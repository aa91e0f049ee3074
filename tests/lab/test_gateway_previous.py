"""The rolling restart of test_gateway.py behind the gateway release before smg 1.x: sglang-router
0.3.2's `smg` (its own venv, scripts/setup.sh --test), which drops a removed worker from its list instead of
listing it draining, and lists no worker status."""

from __future__ import annotations

import os

import pytest
from test_gateway import test_a_rolling_restart_behind_the_gateway_fails_no_request as rollout

from labutil import GOOD, deploy_json
from orchestrator.lab import gateway as lab_gateway
from tests.unit.smgs import PREVIOUS

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def gw(lab):
    assert os.access(PREVIOUS, os.X_OK), f"{PREVIOUS}: no smg 0.3.2 there: run scripts/setup.sh --test"
    names = ",".join(h.name for h in lab.hosts)
    rc, report = deploy_json(lab, "--profile", GOOD, "--limit", names)
    assert rc == 0, report
    state = lab_gateway.up(smg=PREVIOUS)
    yield state
    lab_gateway.down()


def test_a_rolling_restart_behind_smg_0_3_2_fails_no_request(lab, gw):
    workers = lab_gateway.worker_health(gw)
    assert workers and all(w.healthy for w in workers)
    rollout(lab, gw, rolled=lab.hosts[:2])  # two hosts of four: drain and re-add, as 1.x's test does all
