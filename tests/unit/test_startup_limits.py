"""The controller's side of a start-up: usual lengths from the ledger, the stall limits a deploy
gives the health wait, the summary line, the live line and the diagnosis of a stall."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import ledger
from orchestrator.hosts import startup_watch
from orchestrator.hosts.module_results import Phase, Progress
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path))
    return tmp_path


def start(host: str, model: str, result: str = "healthy", **phases: float) -> None:
    row = ledger.DeployRow(
        run_id="r",
        host=host,
        unit_name="sglang.service",
        profile="p",
        digest="d",
        action="deploy",
        result=result,
        restarted=True,
        duration_s=1.0,
        model=model,
        phases=[{"phase": k, "s": v} for k, v in phases.items()],
    )
    ledger.record_deploy(row)


def test_limits_are_the_factor_times_the_median_of_the_hosts_healthy_starts_of_that_model(
    state: Path,
) -> None:
    for weights in (100, 300, 200):
        start("gpu1", "/m", init=5, weights=weights, graphs=20)
    start("gpu1", "/m", result="failed", weights=5000)  # a failed start says nothing of the usual
    start("gpu2", "/m", weights=9)  # another host
    start("gpu1", "/other", weights=9)  # another model
    usual = startup_watch.usual("gpu1", "/m")
    assert usual == {"init": 5, "weights": 200, "graphs": 20}
    assert startup_watch.limits(usual, 3, 120) == {"init": 120, "weights": 600, "graphs": 120}
    # No history: only distributed init is bounded (by the floor), the rest by the health timeout.
    assert startup_watch.limits(startup_watch.usual("gpu3", "/m"), 3, 120) == {"init": 120}


def test_a_ledger_of_before_phases_has_no_history(state: Path) -> None:
    assert startup_watch.usual("gpu1", "/m") == {} and ledger.starts("gpu1", "/m") == []


def test_the_summary_names_the_longest_phases_in_their_order() -> None:
    phases = [
        Phase(phase=p, s=s)
        for p, s in [
            ("launch", 3),
            ("init", 0.05),
            ("weights", 250),
            ("kv_cache", 2),
            ("graphs", 100),
            ("warmup", 22),
        ]
    ]
    line = startup_watch.summary(372, phases)
    assert line == "healthy after 6m12s: launch 3.0s, weights 4m10s, CUDA graphs 1m40s, warm-up 22s"
    assert startup_watch.longest(phases, 2) == "weights 4m10s, CUDA graphs 1m40s"
    assert startup_watch.summary(2.5, []) == "healthy after 2.5s"


def test_the_live_line_says_phase_progress_time_and_what_is_left() -> None:
    line = startup_watch.live("graphs", Progress(done=23, total=36, detail="bs 96"), 72, 40)
    assert line == "CUDA graphs 23/36 (bs 96), 1m12s, ~40 s left"
    assert startup_watch.live("weights", None, 5, None) == "weights, 5.0s"


def test_a_stall_in_init_names_the_profiles_nccl_variables() -> None:
    said = startup_watch.stall_diagnosis("init", 130, 120, ["NCCL_ALGO=Ring", "NCCL_PROTO=LL"], 2)
    assert said.startswith("start-up stalled in distributed init: no new log line for 130 s (limit 120 s)")
    assert "NCCL_ALGO=Ring NCCL_PROTO=LL" in said and "2 nodes" in said
    assert "NCCL_DEBUG=INFO" in startup_watch.stall_diagnosis("init", 130, 120, [], 1)
    assert "cuda-graph-max-bs" in startup_watch.stall_diagnosis("graphs", 400, 360, [], 1)


def test_the_compile_caches_point_into_the_units_cache_directory_and_the_profiles_env_wins(
    tmp_path: Path,
) -> None:
    prof = profile_mod.load("cg_5tok")
    built = launch.build(prof)
    assert "CacheDirectory=orchestrator/sglang\n" in built.unit
    assert built.environment["SGLANG_DG_CACHE_DIR"] == "/var/cache/orchestrator/sglang/deep_gemm"
    assert set(launch.COMPILE_CACHES) <= set(built.environment)
    (tmp_path / "mine.yml").write_text(
        "extends: cg_5tok\nenv: {TRITON_CACHE_DIR: /scratch/triton}\nservice: {unit_name: a.service}\n"
    )
    mine = launch.build(profile_mod.load(str(tmp_path / "mine.yml")))
    assert mine.environment["TRITON_CACHE_DIR"] == "/scratch/triton"
    assert "CacheDirectory=orchestrator/a\n" in mine.unit
    (tmp_path / "off.yml").write_text("extends: cg_5tok\nservice: {compile_cache: false}\n")
    off = launch.build(profile_mod.load(str(tmp_path / "off.yml")))
    assert "CacheDirectory" not in off.unit and "SGLANG_DG_CACHE_DIR" not in off.environment
