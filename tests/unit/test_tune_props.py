"""Property tests of tune's inputs: any space file, and any hand edit of a campaign's rows, ends
in the outcome or in our own error naming what to fix; never in a traceback."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_tune import campaign, installed, write_space
from test_tune import lab as lab
from tunesim import Lab

from orchestrator import ledger
from orchestrator.errors import Interrupted, OrchestratorError
from orchestrator.tuning import space

NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1_0", "\u0663", "\uff13", "0x3", "+3", "5e-1", ".5", "nan", "inf", "1e400", "-0"]),
)
TEXT = st.text(max_size=12)
VALUE = st.one_of(NUMBERS, TEXT, st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=3))
FIELDS = st.sampled_from(
    [
        "speculative.num_steps",
        "speculative.eagle_topk",
        "speculative.num_draft_tokens",
        "server.mem_fraction_static",
        "server.gpus",
        "server.tp_size",
        "env.A",
        "env.A.B",
        "nccl.NCCL_ALGO",
        "service.unit_name",
        "server.cuda_graph_max_bs",
        "name",
        "",
    ]
)
SPACES = st.fixed_dictionaries(
    {
        "vary": st.dictionaries(FIELDS, st.lists(VALUE, min_size=0, max_size=3), max_size=2),
    },
    optional={
        "traffic": st.fixed_dictionaries(
            {},
            optional={
                "concurrency": st.lists(NUMBERS, max_size=3),
                "request_rate": st.lists(NUMBERS, max_size=2),
                "requests": NUMBERS,
                "repeat": NUMBERS,
                "temperature": NUMBERS,
            },
        ),
        "objective": st.dictionaries(
            st.sampled_from(["maximize", "minimize", "goodput", "at_concurrency", "p99_ttft_ms_max"]),
            st.one_of(NUMBERS, st.sampled_from(["tok_s", "p99_ttft_ms", "total_tok_s"])),
            max_size=3,
        ),
        "budget": st.fixed_dictionaries({"restarts": NUMBERS}),
        "search": st.dictionaries(st.sampled_from(["seed", "sampler", "confirm"]), VALUE, max_size=2),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=SPACES)
def test_any_space_file_expands_or_is_refused_with_our_own_error(doc: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "space.yml"
    path.write_text(
        yaml.safe_dump(
            {"extends": "example:cg_5tok", "baseline": "example:baseline", **doc}, allow_unicode=True
        )
    )
    try:
        x = space.expand(path)
    except OrchestratorError as exc:
        assert str(exc).strip()
        return
    assert x.valid  # what expands has a point to measure
    keys = [p.key for p in x.points]
    assert len(set(keys)) == len(keys)


COLUMNS = {
    ("campaigns", "hosts"): st.one_of(TEXT, st.sampled_from(["[]", "null", '["lab1", 3]', '["lab1"]', "{}"])),
    ("trials", "point"): st.one_of(
        TEXT, st.dictionaries(TEXT, VALUE, max_size=2).map(json.dumps), st.sampled_from(["7", "[]", "null"])
    ),
    ("trials", "kind"): st.sampled_from(["baseline", "trial", "confirm", "adaptive", "guess", ""]),
    ("trials", "state"): st.sampled_from(["complete", "stopped", "failed", "infeasible", "odd", ""]),
    ("trials", "value"): st.one_of(st.none(), st.floats(-10, 10), st.just(0.0)),
    ("trials", "number"): st.integers(-5, 50),
    ("trials", "curve_id"): st.one_of(TEXT, st.just("")),
    ("bench_results", "tok_s"): st.one_of(st.none(), st.floats(0, 1000), st.just(0.0)),
}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """A campaign stopped by Ctrl-C after its baseline and two trials: its ledger and space file."""
    folder = tmp_path_factory.mktemp("interrupted")
    with pytest.MonkeyPatch.context() as mp:
        sim = _lab(mp, folder)
        path = write_space(folder, budget={"restarts": 6})
        first = campaign(path, ["lab1"], folder)
        sim.interrupt_at = 4
        with pytest.raises(Interrupted):
            first.run()
    return folder / "state", first.id, path


def _lab(mp: pytest.MonkeyPatch, folder: Path) -> Lab:
    return installed(mp, folder / "state")


EDITS = st.sampled_from(sorted(COLUMNS)).flatmap(lambda c: st.tuples(st.just(c), COLUMNS[c]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(EDITS, min_size=1, max_size=3))
@example(edits=[(("bench_results", "tok_s"), 1.0), (("trials", "kind"), "confirm")])  # a math domain error
@example(edits=[(("bench_results", "tok_s"), None), (("trials", "state"), "complete")])  # no samples
def test_any_hand_edit_of_a_campaign_resumes_or_is_refused(
    edits: list[tuple[tuple[str, str], Any]], interrupted: tuple[Path, str, Path], tmp_path_factory: Any
) -> None:
    state, campaign_id, path = interrupted
    folder = tmp_path_factory.mktemp("resume")
    shutil.copytree(state, folder / "state")
    with pytest.MonkeyPatch.context() as mp:
        _lab(mp, folder)
        with sqlite3.connect(ledger.path()) as conn:
            for (table, column), value in edits:
                key = "id" if table == "campaigns" else ("campaign_id" if table == "trials" else "sweep_id")
                conn.execute(f"UPDATE {table} SET {column}=? WHERE {key}=?", (value, campaign_id))
        try:
            outcome = campaign(path, [], folder, resume=campaign_id).run()
        except OrchestratorError as exc:
            assert str(exc).strip()
        else:
            assert outcome.campaign_id == campaign_id
        ledger.take_unreadable()
