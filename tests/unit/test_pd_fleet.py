"""A prefill/decode fleet on the control machine: the pair's rules, which hosts each role takes, and
how a role's rolling deploy batches keep the fleet serving (docs/pd.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import InputError, ProfileError
from orchestrator.hosts import pd, playvars, rotation
from orchestrator.hosts.playvars import GatewayPlan
from orchestrator.profile import model
from orchestrator.render import launch

GATEWAY = "http://127.0.0.1:39000"


def profile(mode: str | None, **over: Any) -> model.Profile:
    data: dict[str, Any] = {
        "name": f"pd_{mode}" if mode else "plain",
        "server": {
            "sglang_version": "0.5.9",
            "model_path": "/data/models/m",
            "served_model_name": "m",
            "host": "0.0.0.0",
        },
        "speculative": {
            "algorithm": "EAGLE3",
            "draft_model_path": "/data/d",
            "num_steps": 3,
            "eagle_topk": 1,
            "num_draft_tokens": 4,
        },
    }
    if mode is not None:
        data["disaggregation"] = {"mode": mode}
        if mode == "prefill":
            data["server"]["cuda_graph"] = False
    for key, value in over.items():
        section, _, name = key.partition("__")
        data.setdefault(section, {})[name] = value
    return model.validate(data)


def test_each_role_renders_its_flags_and_the_shipped_pair_is_a_fleet() -> None:
    prefill, decode = model.load("pd_prefill"), model.load("pd_decode")
    assert pd.ordered([decode, prefill]) == [prefill, decode]  # prefill rolls first
    p_argv, d_argv = launch.build(prefill).argv, launch.build(decode).argv
    assert p_argv[p_argv.index("--disaggregation-mode") + 1] == "prefill"
    assert d_argv[d_argv.index("--disaggregation-mode") + 1] == "decode"
    # Both name the bootstrap port: a decode server takes its own for a request that names none.
    assert "--disaggregation-bootstrap-port" in p_argv and "--disaggregation-bootstrap-port" in d_argv
    assert "--disable-cuda-graph" in p_argv and "--disable-cuda-graph" not in d_argv


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"server__model_path": "/data/models/other"}, "server.model_path differs"),
        ({"server__served_model_name": "other"}, "served model name differs"),
        ({"disaggregation__transfer_backend": "nixl"}, "transfer_backend differs"),
        ({"disaggregation__bootstrap_port": 9000}, "bootstrap_port differs"),
        ({"speculative__algorithm": "EAGLE"}, "speculative decoding differs"),
        (
            {"speculative__eagle_topk": 2, "speculative__num_draft_tokens": 5},
            "eagle_topk 2 is above prefill's 1",
        ),
        ({"server__extra_args": ["--page-size", "64"]}, "--page-size differs"),
    ],
)
def test_a_pair_that_is_no_fleet_is_refused_naming_what_differs(over: dict, says: str) -> None:
    decode = profile("decode", **over)
    with pytest.raises(InputError, match=says):
        pd.ordered([profile("prefill"), decode])


def test_decode_side_speculative_settings_may_differ_from_prefill() -> None:
    """A campaign tunes decode's steps and draft tokens while prefill stays; a decode server never
    binds the bootstrap port, so its own port may be that number, and TP flags of decode's
    are prefill's only."""
    decode = profile("decode", speculative__num_steps=5, speculative__num_draft_tokens=6, server__port=8998)
    assert [p.name for p in pd.ordered([profile("prefill"), decode])] == ["pd_prefill", "pd_decode"]
    with pytest.raises(ProfileError, match="--disaggregation-decode-tp is a prefill server's setting"):
        profile("decode", server__extra_args=["--disaggregation-decode-tp", "4"])


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (["prefill", None], "plain has no disaggregation section"),
        (["decode", "decode"], "one prefill and one decode profile"),
        (["prefill", "prefill", "decode"], "one prefill and one decode profile"),
    ],
)
def test_several_profiles_must_be_one_prefill_and_one_decode(given: list, says: str) -> None:
    with pytest.raises(InputError, match=says):
        pd.ordered([profile(m) for m in given])


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"server": {"cuda_graph": True}}, "SGLang turns CUDA graphs off on a prefill server"),
        ({"disaggregation": {"mode": "prefill", "transfer_backend": "fake"}}, "fake moves no KV cache"),
        ({"server": {"port": 8998}}, "8998 is the server's own port"),
        ({"disaggregation": {"mode": "prefill", "transfer_backend": "mooncake_tcp"}}, "no transfer backend"),
        ({"disaggregation": {"mode": "both"}}, "disaggregation.mode"),
        ({"deployment": {"kind": "multinode"}}, "not supported yet"),
        (
            {"disaggregation": {"mode": "prefill", "transfer_backend": "ascend", "ib_device": "mlx5_0"}},
            "reads no IB",
        ),
        (
            {"disaggregation": {"mode": "prefill", "ib_device": '{"0": "mlx5_0"}'}},
            "not a per-GPU JSON mapping",
        ),
    ],
)
def test_a_role_sglang_would_change_or_refuse_is_refused_before_any_host(data: dict, says: str) -> None:
    base: dict[str, Any] = {
        "name": "p",
        "server": {"sglang_version": "0.5.9", "model_path": "/m", "cuda_graph": False, "host": "0.0.0.0"},
        "disaggregation": {"mode": "prefill"},
    }
    for key, value in data.items():
        base[key] = {**base.get(key, {}), **value}
    with pytest.raises(ProfileError, match=says):
        model.validate(base)


def test_piecewise_cuda_graphs_keep_cuda_graphs_on_a_prefill_server_and_newer_backends_pass() -> None:
    server = {"sglang_version": "0.5.9", "model_path": "/m", "host": "0.0.0.0"}
    server["extra_args"] = ["--enable-piecewise-cuda-graph"]
    model.validate({"name": "p", "server": server, "disaggregation": {"mode": "prefill"}})
    newer = {"sglang_version": "0.5.23", "model_path": "/m", "host": "::"}  # 0.5.23 keeps prefill's graphs
    model.validate(
        {
            "name": "p",
            "server": newer,
            "disaggregation": {"mode": "prefill", "transfer_backend": "mooncake_tcp"},
        }
    )


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(
        "all:\n  children:\n"
        "    prefill:\n      hosts: {p1: {ansible_host: 10.0.0.1}, p2: {ansible_host: 10.0.0.2}}\n"
        "    decode:\n      hosts: {d1: {ansible_host: 10.0.0.3}, d2: {ansible_host: 10.0.0.4}}\n"
        "    other:\n      hosts: {x1: {ansible_host: 10.0.0.5}}\n"
    )
    return path


def test_each_role_takes_the_hosts_of_its_group(inventory: Path) -> None:
    assert list(playvars.placements(profile("prefill"), inventory, None)) == ["p1", "p2"]
    assert list(playvars.placements(profile("decode"), inventory, None)) == ["d1", "d2"]
    assert list(playvars.placements(profile(None), inventory, "x1")) == ["x1"]
    gw = playvars.placements(profile("prefill"), inventory, None)["p1"].gateway
    assert gw is None  # no orchestrator_gateway_url: nothing to drain


def test_a_fleet_host_never_gets_a_profile_without_its_role(inventory: Path) -> None:
    with pytest.raises(InputError, match="p1 is in the inventory group prefill"):
        playvars.placements(profile(None), inventory, None)
    with pytest.raises(InputError, match=r"no host of .* with --limit x1 is in the inventory group decode"):
        playvars.placements(profile("decode"), inventory, "x1")


def test_a_host_in_both_groups_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    prefill: {hosts: {h: {}}}\n    decode: {hosts: {h: {}}}\n")
    with pytest.raises(InputError, match="host h is in both groups prefill and decode"):
        playvars.placements(profile("decode"), path, None)


# --- the rolling deploy of a role behind the gateway ---------------------------------------------


def worker(url: str, role: str, status: str = "ready") -> dict[str, Any]:
    return {"url": url, "worker_type": role, "status": status, "is_healthy": status == "ready", "id": url}


def plans(*hosts: tuple[str, str]) -> dict[str, GatewayPlan]:
    return {
        h: GatewayPlan(url=GATEWAY, worker_url=f"http://{h}:30000", server_url="", role=role)  # type: ignore[arg-type]
        for h, role in hosts
    }


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = []
    monkeypatch.setattr(rotation.client, "workers", lambda url, key="", timeout=10.0: workers)
    return workers


DECODES = plans(("d1", "decode"), ("d2", "decode"))


def test_a_serving_role_rolls_one_host_at_a_time_by_default(listed: list) -> None:
    listed += [worker("http://p1:30000", "prefill"), worker("http://d1:30000", "decode")]
    listed += [worker("http://d2:30000", "decode")]
    assert rotation.pd_serial(["d1", "d2"], DECODES, {}, None, ["d1", "d2"]) == "1"
    assert rotation.pd_serial(["d1", "d2"], DECODES, {}, "1", ["d1", "d2"]) == "1"


def test_a_role_that_serves_nothing_yet_starts_at_once(listed: list) -> None:
    listed += [worker("http://d1:30000", "decode", "failed")]
    assert rotation.pd_serial(["d1", "d2"], DECODES, {}, None, ["d1", "d2"]) is None


def test_a_batch_taking_a_whole_role_out_of_rotation_is_refused(listed: list) -> None:
    listed += [worker("http://p1:30000", "prefill"), worker("http://d1:30000", "decode")]
    listed += [worker("http://d2:30000", "decode")]
    with pytest.raises(InputError, match=r"takes every decode server in rotation .* out at once"):
        rotation.pd_serial(["d1", "d2"], DECODES, {}, "100%", ["d1", "d2"])


def test_the_last_server_of_a_role_is_restarted_only_when_it_changes(listed: list) -> None:
    listed += [worker("http://p1:30000", "prefill"), worker("http://d1:30000", "decode")]
    one = plans(("d1", "decode"))
    assert rotation.pd_serial(["d1"], one, {}, None, []) == "1"  # runs its plan: stays in
    with pytest.raises(InputError, match="takes every decode server"):
        rotation.pd_serial(["d1"], one, {}, None, ["d1"])


def test_a_decode_server_is_not_taken_out_while_no_prefill_serves(listed: list) -> None:
    listed += [worker("http://p1:30000", "prefill", "failed")]
    listed += [worker("http://d1:30000", "decode"), worker("http://d2:30000", "decode")]
    with pytest.raises(InputError, match="no prefill server is in rotation"):
        rotation.pd_serial(["d1", "d2"], DECODES, {}, None, ["d1", "d2"])


def test_the_guard_on_the_host_says_the_same_at_each_batch() -> None:
    client = rotation.client
    both = [worker("http://p1:30000", "prefill"), worker("http://d1:30000", "decode")]
    assert "the last decode server" in str(client.pd_guard(both, "http://d1:30000", "decode"))
    assert "the last prefill server" in str(client.pd_guard(both, "http://p1:30000", "prefill"))
    more = [*both, worker("http://d2:30000", "decode")]
    assert client.pd_guard(more, "http://d1:30000", "decode") is None
    failed = [worker("http://p1:30000", "prefill", "failed"), *more[1:]]
    assert "no prefill server is in rotation" in str(client.pd_guard(failed, "http://d1:30000", "decode"))
    # A worker that is out already (failed) is taken out whatever else serves.
    assert client.pd_guard(failed, "http://p1:30000", "prefill") is None
    assert client.pd_guard(both, "http://d1:30000", "") is None  # not a PD worker


def test_a_gateway_that_knows_the_role_by_other_urls_is_refused(listed: list) -> None:
    """Rolling hosts the gateway does not list as if nothing served would take the role down."""
    listed += [worker("http://gpu-d1:30000", "decode"), worker("http://gpu-d2:30000", "decode")]
    with pytest.raises(InputError, match="set orchestrator_gateway_worker_url"):
        rotation.pd_serial(["d1", "d2"], DECODES, {}, None, ["d1", "d2"])


def test_a_worker_listed_with_another_role_or_port_is_refused(listed: list) -> None:
    listed += [worker("http://d1:30000", "regular")]
    with pytest.raises(InputError, match="lists http://d1:30000 as a regular worker"):
        rotation.check(plans(("d1", "decode")), {})
    listed[:] = [{**worker("http://p1:30000", "prefill"), "bootstrap_port": 9000}]
    prefill = {"p1": GatewayPlan(url=GATEWAY, worker_url="http://p1:30000", server_url="", role="prefill")}
    prefill["p1"] = prefill["p1"].model_copy(update={"bootstrap_port": 8998})
    with pytest.raises(InputError, match="with bootstrap port 9000, not 8998"):
        rotation.check(prefill, {})


def test_after_a_deploy_only_a_failed_or_dropped_worker_is_put_back(monkeypatch, listed: list) -> None:
    from orchestrator.hosts.host_report import HostReport

    added: list[tuple[str, str, int | None]] = []

    def add(gateway, url, key="", worker_key="", timeout_s=60.0, *, role="", bootstrap_port=None):
        added.append((url, role, bootstrap_port))
        return worker(url, role)

    monkeypatch.setattr(rotation.client, "add", add)
    listed += [
        worker("http://d1:30000", "decode", "failed"),
        worker("http://d2:30000", "decode", "not_ready"),
    ]
    reports = [HostReport(host=h, ok=True, step="") for h in ("d1", "d2", "d3")]
    gws = plans(("d1", "decode"), ("d2", "decode"), ("d3", "decode"))
    rotation.heal(reports, gws, {}, "")
    assert added == [("http://d1:30000", "decode", None), ("http://d3:30000", "decode", None)]
    assert reports[0].gateway["back"]["before"]["status"] == "failed" and reports[0].gateway["back"]["healed"]
    assert not reports[1].gateway  # not ready yet: smg's own probes bring it in
