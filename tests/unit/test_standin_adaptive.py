"""The stand-in's adaptive speculative decoding (`--speculative-adaptive`), as SGLang 0.5.23 runs it.

The rule is tested on the host code itself (sglang/_adaptive.py, loaded by path); the server is
run as in test_standin_sglang.py, for what a deployment sees: its start lines, its errors, its
/server_info and a speed that follows the tier.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_standin_sglang import Lab
from test_standin_speed import host_module

from orchestrator.lab.standins import eagle3_config, write_model_dir
from orchestrator.profile import sglang_rules

adaptive = host_module("_adaptive")
speed = host_module("_speed")
#: The decode CUDA-graph batch sizes of a speculative server (the stand-in's _load).
GRAPH_BS = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8)]


def tier(steps: int, a: float = 0.44):
    return speed.SpecSettings(steps, 1, steps + 1, a)


def accepted(steps: int, a: float) -> float:
    """Draft tokens a request accepts per round at `steps` with top-1 acceptance `a`."""
    return speed.accept_length(tier(steps, a)) - 1.0


def run(ctrl, batch: int, a: float, batches: int) -> list[tuple[int, list[str]]]:
    """`batches` verify batches of `batch` requests: (steps of each batch, lines it logged)."""
    seen = []
    for _ in range(batches):
        lines = ctrl.activate(batch)
        steps = ctrl.steps
        lines += ctrl.verify_done(accepted(steps, a), batch)
        seen.append((steps, lines))
    return seen


# --- the config, as SGLang's loader reads it ----------------------------------------------------


def test_the_default_config_starts_each_tier_where_sglang_does() -> None:
    slots = adaptive.load_config(None)
    assert adaptive.candidates(slots) == [0, 1, 3, 5, 7]
    start = adaptive.start_steps(slots, None)
    ctrl = adaptive.Controller(slots, start, GRAPH_BS)
    assert start == 3 and {key: slot.steps for key, slot in ctrl.slots.items()} == {1: 3, 8: 3, 32: 1, 64: 0}
    assert ctrl.init_line() == "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 5, 7]"


def test_the_profile_rules_read_the_tiers_as_the_server_does() -> None:
    """sglang_rules judges num_steps with the same default tiers, candidates and start step."""
    slots = adaptive.load_config(None)
    tiers = {key: cfg["candidate_steps"] for key, cfg in slots.items()}
    assert tiers == sglang_rules.DEFAULT_ADAPTIVE_TIERS
    own = {1: [1, 3], 16: [0, 2, 4]}
    slots = {key: {"candidate_steps": steps} for key, steps in own.items()}
    assert adaptive.candidates(slots) == sglang_rules.adaptive_candidates(own) == [0, 1, 2, 3, 4]
    for given in (None, 4):
        assert adaptive.start_steps(slots, given) == sglang_rules.adaptive_start_steps(own, given)


def test_top_level_keys_are_every_tiers_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(
        json.dumps(
            {
                "ema_alpha": 0.5,
                "1": {"candidate_steps": [1, 3]},
                "8": {"candidate_steps": [0], "ema_alpha": 0.1},
            }
        )
    )
    slots = adaptive.load_config(str(path))
    assert slots[1]["ema_alpha"] == 0.5 and slots[8]["ema_alpha"] == 0.1  # a tier's own value wins


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"candidate_steps": [1, 3, 7], "ema_alpha": 0.2},  # the old flat format
            'speculative_adaptive_config must contain at least one integer-string BS key, e.g. {"1": '
            "{\"candidate_steps\": [1,3,7]}}. Got keys: ['candidate_steps', 'ema_alpha']",
        ),
        ({"1": {"candidate_steps": []}}, "BS 1: candidate_steps must be a list of non-negative ints, got []"),
        (
            {"8": {"candidate_steps": [1, -1]}},
            "BS 8: candidate_steps must be a list of non-negative ints, got [1, -1]",
        ),
    ],
)
def test_a_config_sglang_refuses_is_refused_with_its_words(
    tmp_path: Path, config: dict, message: str
) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError) as info:
        adaptive.load_config(str(path))
    assert str(info.value) == message


def test_a_batch_is_padded_to_a_captured_size_before_its_tier_is_chosen() -> None:
    slots = adaptive.load_config(None)
    ctrl = adaptive.Controller(slots, 3, GRAPH_BS)
    sizes = (1, 7, 8, 30, 31, 32, 60, 61, 64, 500)
    # 31 runs in the graph of 32, 61 to 63 in that of 64: a tier up from their own size.
    assert [ctrl.slot_key(bs) for bs in sizes] == [1, 1, 8, 8, 32, 32, 32, 64, 64, 64]
    own = {1: {"candidate_steps": [1]}, 10: {"candidate_steps": [0]}}
    assert adaptive.Controller(own, 1, GRAPH_BS).slot_key(9) == 10  # 9 runs in the graph of 10
    assert adaptive.Controller(own, 1, None).slot_key(9) == 1  # without graphs: as it is
    assert adaptive.Controller({4: {"candidate_steps": [1]}}, 1, None).slot_key(1) == 4  # below every key


# --- the switching rule --------------------------------------------------------------------------


def test_at_batch_1_high_acceptance_climbs_after_warm_up() -> None:
    ctrl = adaptive.Controller(adaptive.load_config(None), 3, GRAPH_BS)
    seen = run(ctrl, batch=1, a=0.95, batches=30)
    steps = [s for s, _ in seen]
    # EMA from 2 towards 2.71 accepted drafts: above 3 - 0.5 at the first decision (batch 15); at
    # 5 steps 4.30 stays under 4.5 and over the drop threshold 2.25.
    assert steps[:15] == [3] * 15 and steps[15:] == [5] * 15
    assert seen[14][1][0].startswith("Adaptive spec params updated: steps 3 -> 5 (ema_accept_len=2.6")
    assert seen[14][1][1] == "Switch adaptive runtime state: steps 3 -> 5, draft_tokens 4 -> 6"
    assert all(not lines for _, lines in seen[:14])


def test_at_batch_1_low_acceptance_steps_down() -> None:
    ctrl = adaptive.Controller(adaptive.load_config(None), 3, GRAPH_BS)
    seen = run(ctrl, batch=1, a=0.1, batches=20)
    assert [s for s, _ in seen][14:] == [3, 1, 1, 1, 1, 1]  # 0.18 <= 1 - 0.5 - 0.25 at batch 15
    assert seen[14][1][1] == "Switch adaptive runtime state: steps 3 -> 1, draft_tokens 4 -> 2"


def test_at_batch_64_or_more_the_default_tiers_stay_at_no_drafting() -> None:
    ctrl = adaptive.Controller(adaptive.load_config(None), 3, GRAPH_BS)
    seen = run(ctrl, batch=64, a=0.95, batches=40)
    assert seen[0][1] == ["Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1"]
    assert {s for s, _ in seen} == {0} and not any(lines for _, lines in seen[1:])
    assert ctrl.slots[64].ema == -1.0  # no batch without drafts moves it


def test_from_no_drafting_a_tier_probes_the_next_one_up() -> None:
    ctrl = adaptive.Controller(
        {1: {"candidate_steps": [0, 1], "warmup_batches": 0, "update_interval": 1}}, 0, None
    )
    assert run(ctrl, batch=1, a=0.0, batches=2)[0][1][-1].endswith("steps 0 -> 1, draft_tokens 1 -> 2")
    assert ctrl.steps == 0  # ...and back down, accepting nothing


def test_each_batch_size_range_keeps_its_own_tier() -> None:
    ctrl = adaptive.Controller(adaptive.load_config(None), 3, GRAPH_BS)
    run(ctrl, batch=1, a=0.95, batches=15)
    assert ctrl.activate(16) == ["Switch adaptive runtime state: steps 5 -> 3, draft_tokens 6 -> 4"]
    assert ctrl.activate(2) == ["Switch adaptive runtime state: steps 3 -> 5, draft_tokens 4 -> 6"]


def test_the_ceiling_lowers_a_high_tier_only() -> None:
    cfg = {"candidate_steps": [1, 3, 7], "ceiling_coeff": 0.5, "down_hysteresis": -5.0}
    slot = adaptive.Slot(cfg, 7)
    slot.ema = 4.4  # keeps 7 by the thresholds (a drop needs <= 2.5 - 5); the cap is ceil(2.2) = 3
    assert slot.decide() == 3
    slot = adaptive.Slot(cfg, 1)
    slot.ema = 6.9  # climbs to 7 past the cap ceil(3.45) = 4: the cap never holds a rise back
    assert slot.decide() == 7


# --- the server ----------------------------------------------------------------------------------


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path, version="0.5.23")
    write_model_dir(sure(lab), eagle3_config(), accept_top1=0.95)
    yield lab
    lab.close()


def sure(lab: Lab) -> Path:
    """A drafter the target almost always agrees with."""
    return lab.root / "models/sure"


def adaptive_args(lab: Lab, config: dict | None, *more: str) -> list[str]:
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(sure(lab))]
    args += ["--speculative-adaptive", *more]
    if config is not None:
        path = lab.root / "tiers.json"
        path.write_text(json.dumps(config))
        args += ["--speculative-adaptive-config", str(path)]
    return args


CONFIG = {
    "warmup_batches": 2,
    "update_interval": 2,
    "1": {"candidate_steps": [1, 3, 5]},
    "8": {"candidate_steps": [0, 1]},
}


def test_the_server_switches_tiers_and_its_speed_follows_them(lab: Lab) -> None:
    server = lab.start(*adaptive_args(lab, CONFIG, "--enable-metrics"))
    server.wait_ready()
    info = server.json("GET", "/server_info")
    assert info["speculative_adaptive"] is True and info["speculative_eagle_topk"] == 1
    assert info["internal_states"][0]["speculative_num_steps"] == 3
    tokens = 600
    body = {"text": "x", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}, "stream": True}
    resp = server.request("POST", "/generate", body)
    start = time.monotonic()
    resp.read()
    took = time.monotonic() - start
    state = server.json("GET", "/server_info")["internal_states"][0]
    assert (state["speculative_num_steps"], state["speculative_num_draft_tokens"]) == (5, 6)
    assert "sglang:spec_num_steps{" in server.request("GET", "/metrics").read().decode()
    # The same rounds on paper: each at its tier's accept length and round cost.
    ctrl = adaptive.Controller(adaptive.load_config(str(lab.root / "tiers.json")), 3, GRAPH_BS)
    reached = seconds = 0.0
    tiers = []
    while int(reached + 1e-9) < tokens:
        ctrl.activate(1)
        spec = tier(ctrl.steps, 0.95)
        tiers.append(ctrl.steps)
        reached += speed.accept_length(spec)
        seconds += speed.round_cost(spec, True, 1) / 300.0
        ctrl.request_round(speed.accept_length(spec) - 1.0, 1)
    static = tokens / speed.decode_model(300.0, tier(3, 0.95), True).tok_s
    assert set(tiers) == {3, 5} and seconds < static * 0.95  # the tiers make a difference to see
    assert took == pytest.approx(seconds, rel=0.03)
    log = server.stop()
    assert "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 5]" in log
    assert (
        "Built adaptive runtime state steps=0: elapsed=" in log
        and "Built adaptive runtime state steps=3" not in log
    )
    assert "Adaptive spec params updated: steps 3 -> 5 (ema_accept_len=" in log
    assert "Switch adaptive runtime state: steps 3 -> 5, draft_tokens 4 -> 6" in log


def test_num_steps_outside_the_tiers_is_sglangs_value_error(lab: Lab) -> None:
    result = lab.run(
        "--model-path", str(lab.target), *adaptive_args(lab, CONFIG, "--speculative-num-steps", "2")
    )
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith(
        "ValueError: --speculative-num-steps=2 is not in the adaptive config candidate_steps [0, 1, 3, 5]. "
        "Pass one of those values."
    )


def test_a_flat_config_is_refused_at_start(lab: Lab) -> None:
    result = lab.run("--model-path", str(lab.target), *adaptive_args(lab, {"candidate_steps": [1, 3]}))
    assert result.returncode == 1
    assert (
        "ValueError: speculative_adaptive_config must contain at least one integer-string BS key"
        in result.stderr
    )


def test_top_k_above_1_falls_back_to_static_with_sglangs_warning(lab: Lab) -> None:
    tree = [
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
        "--speculative-num-draft-tokens",
        "5",
    ]
    server = lab.start(*adaptive_args(lab, None, *tree))
    server.wait_ready()
    assert server.json("GET", "/server_info")["speculative_adaptive"] is False
    log = server.stop()
    assert (
        "speculative_adaptive disabled: speculative_eagle_topk=4 (only topk=1 is supported). "
        "Falling back to static speculative params." in log
    )
    assert "AdaptiveSpeculativeParams" not in log


def test_sglang_0_5_9_has_no_such_flag(tmp_path: Path) -> None:
    lab = Lab(tmp_path, version="0.5.9")
    try:
        result = lab.run("--model-path", str(lab.target), "--speculative-adaptive")
        assert result.returncode == 2 and "unrecognized arguments: --speculative-adaptive" in result.stderr
    finally:
        lab.close()
