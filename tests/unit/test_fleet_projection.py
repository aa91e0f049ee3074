"""benchmarks/fleet_speed.py's arithmetic (the fit, Ansible's batch count, the forks it recommends, the
projected rollout) and the CPU its timing helper reads from a command's reaped process tree. No lab.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports _timing beside it
    spec = importlib.util.spec_from_file_location("fleet_speed", BENCHMARKS / "fleet_speed.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fleet_speed", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def test_the_fit_finds_the_line_the_points_lie_on(fleet: ModuleType) -> None:
    line = fleet.fit_line([(1, 2.5), (2, 3.0), (4, 4.0), (16, 10.0)])
    assert line.a == pytest.approx(2.0)
    assert line.b == pytest.approx(0.5)
    assert line.at(500) == pytest.approx(252.0)
    with pytest.raises(ValueError, match="two host counts"):
        fleet.fit_line([(4, 1.0), (4, 2.0)])


def test_batches_and_forks_are_counted_as_ansible_counts_them(fleet: ModuleType) -> None:
    assert fleet.batch_size("10%", 500) == 50
    assert fleet.batch_size("10%", 5) == 1  # a percentage rounds down, at least one host
    assert fleet.batch_size("25", 10) == 10
    assert fleet.recommended_forks(50, cores=16) == 50
    assert fleet.recommended_forks(1000, cores=16) == 16 * fleet.FORKS_PER_CORE


def test_a_rollout_is_bound_by_its_hosts_or_by_the_control_machine(fleet: ModuleType) -> None:
    cpu, floor = fleet.Line(2.0, 1.0), fleet.Line(1.0, 0.1)
    roomy = fleet.project("full", 500, "10%", 16, cpu, floor, per_batch_s=12.0)
    assert (roomy.batch, roomy.batches, roomy.forks) == (50, 10, 50)
    assert roomy.cpu_bound_s == pytest.approx(502 / 16)
    assert roomy.floor_s == pytest.approx(51.0)
    assert (roomy.host_bound_s, roomy.wall_s, roomy.bound) == (120.0, 120.0, "hosts")
    one_core = fleet.project("full", 500, "10%", 1, cpu, floor, per_batch_s=12.0)
    assert one_core.forks == fleet.FORKS_PER_CORE  # batches of 50 then run in two waves of 25
    assert one_core.host_bound_s == 10 * 2 * 12.0
    assert (one_core.wall_s, one_core.bound) == (502.0, "control CPU")


def test_the_cpu_of_a_grandchild_is_the_commands(fleet: ModuleType) -> None:
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}], check=True)"
    measured = fleet.timed_cpu([sys.executable, "-c", spawn])
    assert measured.cpu_s >= 0.3
    assert measured.wall_s >= 0.3
