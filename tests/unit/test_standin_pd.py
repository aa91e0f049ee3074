"""The SGLang stand-in serves prefill/decode disaggregation as SGLang does (sglang/_pd.py).

A prefill and a decode stand-in run on 127.0.0.1 with free ports, each from the installed root
filesystem. A request goes to both at once with the same bootstrap fields, as smg sends it. The
last test puts the real `smg launch --pd-disaggregation` in front of them when smg is installed.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.lab.standins import DIST_PACKAGES, MOONCAKE_VERSION, kimi_config, write_model_dir
from tests.unit.test_standin_sglang import FAST, KIMI_TOKENIZER, PYTHON, Lab, Server, free_port

#: Prompt tokens per second of the prefill: a 40-word prompt prefills in 0.4 s.
PREFILL_TOK_S = 100.0
PROMPT = " ".join(["word"] * 40)
PREFILL_S = 40 / PREFILL_TOK_S
#: What the stand-in decodes, word by word (sglang._engine.WORDS).
TWELVE = " the lab host serves tokens at a steady pace while drafts verify"
RID = r"'[0-9a-f]{32}'"


class PDLab(Lab):
    """A Lab whose target prefills at PREFILL_TOK_S, with helpers for the two roles."""

    def __init__(self, root: Path, version: str = "0.5.9") -> None:
        super().__init__(root, version=version)
        knobs = dict(FAST, base_tok_s=300.0, prefill_tok_s=PREFILL_TOK_S)
        self.target = write_model_dir(root / "models/pd", kimi_config(), KIMI_TOKENIZER, **knobs)
        self.bootstrap = free_port()

    def role(self, mode: str, *args: str, log: Path | None = None, env: dict | None = None) -> Server:
        """A server of `mode` on 127.0.0.1, the decode on the second GPU."""
        saved = self.env
        self.env = dict(self.env, **(env or {}))
        try:
            gpu = ["--base-gpu-id", "1"] if mode == "decode" else []
            return self.start(
                "--host",
                "127.0.0.1",
                "--disaggregation-mode",
                mode,
                "--disaggregation-bootstrap-port",
                str(self.bootstrap),
                *gpu,
                *args,
                log=log,
            )
        finally:
            self.env = saved

    def pair(self, env: dict | None = None) -> tuple[Server, Server, Path, Path]:
        """A ready prefill and decode, their logs in files."""
        logs = self.root / "prefill.log", self.root / "decode.log"
        prefill = self.role("prefill", log=logs[0], env=env)
        decode = self.role("decode", log=logs[1], env=env)
        prefill.wait_ready()
        decode.wait_ready()
        return prefill, decode, *logs

    def fields(self, room: int, port: int | None = None) -> dict:
        port = self.bootstrap if port is None else port
        return {"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}


@pytest.fixture
def labs(tmp_path: Path) -> Iterator[Callable[..., PDLab]]:
    made: list[PDLab] = []

    def make(version: str = "0.5.9") -> PDLab:
        made.append(PDLab(tmp_path / version, version))
        return made[-1]

    yield make
    for lab in made:
        lab.close()


class Leg(threading.Thread):
    """One POST in its own thread, as smg sends the two legs: status, first event, whole body."""

    def __init__(self, server: Server, path: str, body: dict) -> None:
        super().__init__()
        self.server, self.path, self.body = server, path, body
        self.status = 0
        self.first_event_s: float | None = None
        self.elapsed_s = 0.0
        self.data = b""

    def run(self) -> None:
        start = time.monotonic()
        resp = self.server.request("POST", self.path, self.body)
        self.status = resp.status
        lines = []
        while line := resp.readline():
            if self.first_event_s is None and line.startswith(b"data: "):
                self.first_event_s = time.monotonic() - start
            lines.append(line)
        self.data = b"".join(lines)
        self.elapsed_s = time.monotonic() - start

    def events(self) -> list[dict | str]:
        text = self.data.decode()
        out: list[dict | str] = []
        for line in text.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out

    def json(self) -> dict:
        return json.loads(self.data)


def send_both(prefill: Server, decode: Server, path: str, body: dict) -> tuple[Leg, Leg]:
    legs = Leg(prefill, path, body), Leg(decode, path, body)
    for leg in legs:
        leg.start()
    for leg in legs:
        leg.join(timeout=60)
    return legs


def wait_for_line(log: Path, needle: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in {log.name}:\n{log.read_text()[-3000:]}")


# --- a request served by the pair ------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "connected"),
    [
        (
            "0.5.9",
            "Fetch prefill parallel info from [127.0.0.1:{port}]: DP size:1, TP size:1 PP size:1 Page size:1",
        ),
        ("0.5.23", "Prefill parallel info for [127.0.0.1:{port}]: PrefillServerInfo(attn_tp_size=1, "),
    ],
)
def test_a_request_sent_to_both_returns_the_decodes_tokens_after_the_prefill(
    labs: Callable[..., PDLab], version: str, connected: str
) -> None:
    lab = labs(version)
    prefill, decode, prefill_log, decode_log = lab.pair()
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0}, "stream": True}
    first, second = send_both(prefill, decode, "/generate", {**body, **lab.fields(room=42)})
    assert (first.status, second.status) == (200, 200)

    *_, last_prefill, done = first.events()
    assert done == "[DONE]" and isinstance(last_prefill, dict)
    assert last_prefill["text"] == " the"
    assert last_prefill["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert last_prefill["meta_info"]["completion_tokens"] == 1

    *_, last, done = second.events()
    assert done == "[DONE]" and isinstance(last, dict)
    assert last["text"] == TWELVE
    assert last["meta_info"]["prompt_tokens"] == 40 and last["meta_info"]["completion_tokens"] == 12
    # TTFT splits: the prefill's time is spent on the prefill server, before the decode's first token
    assert second.first_event_s is not None and second.first_event_s >= PREFILL_S * 0.95

    wait_for_line(decode_log, connected.format(port=lab.bootstrap))
    batch = wait_for_line(prefill_log, "Prefill batch, #new-seq: 1, #new-token: 40")
    assert batch.endswith("#prealloc-req: 0, #inflight-req: 0")
    assert "Prefill batch" not in decode_log.read_text()  # the decode gets its KV, prefills nothing


def test_the_openai_routes_take_the_bootstrap_fields_too(labs: Callable[..., PDLab]) -> None:
    lab = labs()
    prefill, decode, *_ = lab.pair()
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5, "temperature": 0}
    first, second = send_both(prefill, decode, "/v1/chat/completions", {**body, **lab.fields(room=1)})
    assert first.json()["choices"][0]["message"]["content"] == " the"
    assert first.json()["usage"]["completion_tokens"] == 1
    assert second.json()["choices"][0]["message"]["content"] == " the lab host serves tokens"
    first, second = send_both(
        prefill, decode, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, **lab.fields(room=2)}
    )
    assert (first.json()["choices"][0]["text"], second.json()["choices"][0]["text"]) == (
        " the",
        " the lab host",
    )


# --- failures, as SGLang's scheduler aborts them ----------------------------------------------


def test_a_kv_that_never_comes_fails_after_the_waiting_timeout(labs: Callable[..., PDLab]) -> None:
    lab = labs()
    env = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "1", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "1"}
    prefill, decode, prefill_log, decode_log = lab.pair(env)
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True, **lab.fields(room=8)}
    legs = [
        Leg(decode, "/generate", {"text": PROMPT, **lab.fields(room=7)}),
        Leg(decode, "/v1/chat/completions", chat),
        Leg(prefill, "/generate", {"text": PROMPT, **lab.fields(room=9)}),
    ]
    for leg in legs:  # three rooms, each leg alone: its partner never comes
        leg.start()
    for leg in legs:
        leg.join(timeout=30)
    decode_leg, stream_leg, prefill_leg = legs

    assert decode_leg.status == 500
    error = decode_leg.json()
    assert (error["object"], error["type"], error["code"], error["param"]) == ("error", "500", 500, None)
    assert re.fullmatch(
        rf"Decode transfer failed for request rank=0 decode_req\.req\.rid={RID} "
        r"decode_req\.req\.bootstrap_room=7 with exception KVTransferError\(bootstrap_room=7\): "
        r"Request 7 timed out after 1\.\ds in KVPoll\.WaitingForInput",
        error["message"],
    ), error["message"]
    assert error["message"] in decode_log.read_text()
    wait_for_line(
        decode_log, "Some requests fail to receive KV Cache transfer done signal after bootstrapping."
    )

    assert stream_leg.status == 200  # a stream has begun: it ends with an abort
    *_, finish, done = stream_leg.events()
    assert done == "[DONE]" and isinstance(finish, dict)
    assert finish["choices"][0]["finish_reason"] == "abort"

    assert prefill_leg.status == 500
    assert re.fullmatch(
        rf"Prefill bootstrap failed for request rank=0 req\.rid={RID} req\.bootstrap_room=9 with exception "
        r"KVTransferError\(bootstrap_room=9\): Request 9 timed out after 1\.\ds in KVPoll\.Bootstrapping",
        prefill_leg.json()["message"],
    )
    wait_for_line(prefill_log, "Some requests timed out when bootstrapping")


def test_a_prefill_that_cannot_be_reached_fails_the_handshake_at_once(labs: Callable[..., PDLab]) -> None:
    lab = labs()
    decode = lab.role("decode", log=lab.root / "decode.log")
    decode.wait_ready()
    nobody = free_port()
    resp = decode.request("POST", "/generate", {"text": "hi", **lab.fields(room=3, port=nobody)})
    assert resp.status == 500
    message = json.loads(resp.read())["message"]
    assert message.endswith(
        "decode_req.req.bootstrap_room=3 with exception KVTransferError(bootstrap_room=3): "
        f"Could not fetch prefill parallel info from bootstrap_addr: 127.0.0.1:{nobody}"
    )
    assert message.startswith("Decode handshake failed for request rank=0 ")
    line = wait_for_line(lab.root / "decode.log", "Error fetching prefill parallel info from bootstrap: ")
    assert f"HTTPConnectionPool(host='127.0.0.1', port={nobody}): Max retries exceeded" in line
    assert "[Errno 111] Connection refused" in line


def test_a_request_without_a_bootstrap_room_is_refused(labs: Callable[..., PDLab]) -> None:
    lab = labs()
    prefill, decode, *_ = lab.pair()
    refused = "Invalid request: Disaggregated request received without bootstrap room id. req.rid="
    resp = decode.request("POST", "/generate", {"text": "hi"})
    assert resp.status == 400
    assert json.loads(resp.read())["error"]["message"].startswith(refused)
    resp = decode.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    body = json.loads(resp.read())
    assert (resp.status, body["type"], body["code"]) == (400, "BadRequestError", 400)
    leg = Leg(prefill, "/generate", {"text": "hi", "stream": True})
    leg.run()
    first, done = leg.events()
    assert leg.status == 200 and done == "[DONE]" and isinstance(first, dict)
    reason = first["meta_info"]["finish_reason"]
    assert (reason["type"], reason["status_code"]) == ("abort", 400)
    assert reason["message"].startswith(refused)


def test_the_decode_forgets_a_prefill_that_stops_and_fails_its_waiting_requests(
    labs: Callable[..., PDLab],
) -> None:
    lab = labs()
    env = {
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",  # SGLang's floor makes it 2 s
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1",
    }
    prefill, decode, _, decode_log = lab.pair(env)
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    send_both(prefill, decode, "/generate", {**body, **lab.fields(room=5)})  # the decode knows it now
    waiting = Leg(decode, "/generate", {**body, **lab.fields(room=6)})  # its prefill leg never comes
    waiting.start()
    time.sleep(0.5)
    prefill.stop()
    waiting.join(timeout=15)

    addr = f"127.0.0.1:{lab.bootstrap}"
    assert waiting.status == 500
    assert waiting.json()["message"].endswith(
        f"KVTransferError(bootstrap_room=6): Losing connection with prefill instance (bootstrap_addr: {addr})"
    )
    wait_for_line(decode_log, f"Attempting to reconnect to {addr}...")
    lost = wait_for_line(decode_log, "Losing connection with prefill instance")
    assert lost.endswith(
        f"] Losing connection with prefill instance (bootstrap_addr: {addr}), 1 requests affected"
    )


# --- what a tool reads: server info, the bootstrap server, the packages -----------------------------


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_server_info_shows_each_role(labs: Callable[..., PDLab], version: str) -> None:
    lab = labs(version)
    prefill, decode, prefill_log, decode_log = lab.pair()
    path = "/get_server_info" if version == "0.5.9" else "/server_info"
    shown = prefill.json("GET", path), decode.json("GET", path)
    for info, mode in zip(shown, ("prefill", "decode"), strict=True):
        assert info["disaggregation_mode"] == mode
        assert info["disaggregation_bootstrap_port"] == lab.bootstrap
        assert info["disaggregation_transfer_backend"] == "mooncake"
    assert shown[0]["load_balance_method"] == "follow_bootstrap_room"
    assert shown[0]["disable_cuda_graph"] is True  # 0.5.9: no graphs on a prefill; 0.5.23: no decode graphs
    assert shown[1]["disable_radix_cache"] is True
    assert "Capture" not in prefill_log.read_text()
    decode_line = "KV cache is forced as chunk cache for decode server"
    if version == "0.5.9":
        assert shown[0]["disaggregation_decode_tp"] == 1
        wait_for_line(
            prefill_log, "Cuda graph is disabled for prefill server when piecewise cuda graph is not enabled."
        )
        wait_for_line(
            prefill_log, "End of prefill disaggregation mode warmup with status 200, resp: [{'text': ' the'"
        )
    else:
        decode_line = "Radix cache is disabled for decode server"
        wait_for_line(
            prefill_log, f"CommonKVBootstrapServer started successfully on 127.0.0.1:{lab.bootstrap}"
        )
        wait_for_line(prefill_log, "End of disaggregation warmup")
    wait_for_line(decode_log, decode_line)
    wait_for_line(decode_log, "Start of pd disaggregation warmup ...")


def test_a_plain_server_shows_mode_null(labs: Callable[..., PDLab]) -> None:
    lab = labs()
    server = lab.start()
    server.wait_ready()
    info = server.json("GET", "/get_server_info")
    assert (info["disaggregation_mode"], info["disaggregation_bootstrap_port"]) == ("null", 8998)


def bootstrap_get(lab: PDLab, path: str, method: str = "GET") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", lab.bootstrap, timeout=10)
    conn.request(method, path)
    resp = conn.getresponse()
    return resp.status, resp.read().decode()


def test_the_bootstrap_server_is_up_while_the_model_loads_and_has_sglangs_routes(
    labs: Callable[..., PDLab],
) -> None:
    lab = labs()
    prefill = lab.role("prefill", env={"SGLANG_STANDIN_LOAD_DELAY_S": "1.5"})
    every = "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"
    deadline = time.monotonic() + 10
    while True:  # the port opens at start; the ranks register once the model loaded
        try:
            status, text = bootstrap_get(lab, every)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert prefill.status() is None  # the HTTP port is still closed
    assert (status, json.loads(text)["prefill_attn_tp_size"]) == (200, None)
    prefill.wait_ready()
    assert bootstrap_get(lab, "/health") == (200, "OK")
    status, text = bootstrap_get(lab, every)
    assert json.loads(text) == {
        "prefill_attn_tp_size": 1,
        "prefill_dp_size": 1,
        "prefill_pp_size": 1,
        "prefill_page_size": 1,
    }
    status, text = bootstrap_get(lab, "/route?engine_rank=0&target_dp_group=0&target_pp_rank=0")
    assert status == 200 and set(json.loads(text)) == {"rank_ip", "rank_port"}
    assert bootstrap_get(lab, "/route?engine_rank=0") == (400, "Missing inputs for bootstrap server.")
    assert bootstrap_get(lab, "/route", "POST") == (405, "Method not allowed")
    assert bootstrap_get(lab, "/standin/kv?room=9&wait=0") == (204, "")


def test_0_5_23_routes_by_its_own_query_names(labs: Callable[..., PDLab]) -> None:
    lab = labs("0.5.23")
    prefill = lab.role("prefill")
    prefill.wait_ready()
    status, text = bootstrap_get(
        lab, "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
    )
    info = json.loads(text)
    assert status == 200
    assert (info["attn_tp_size"], info["dp_size"], info["prefill_http_port"]) == (1, 1, prefill.port)
    assert info["follow_bootstrap_room"] is True
    status, _ = bootstrap_get(
        lab, "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
    )
    assert status == 200
    assert bootstrap_get(lab, "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1")[0] == 400


def test_mooncake_is_importable_on_a_lab_host_and_nixl_is_not(labs: Callable[..., PDLab]) -> None:
    lab = labs()
    code = (
        "import importlib.metadata, mooncake.engine\n"
        "print(importlib.metadata.version('mooncake-transfer-engine'))\n"
        "try:\n    mooncake.engine.TransferEngine()\nexcept RuntimeError as err:\n    print(err)\n"
        "import nixl\n"
    )
    env = dict(lab.env, PYTHONPATH=str(lab.root / DIST_PACKAGES))
    result = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    version, error = result.stdout.splitlines()
    assert version == MOONCAKE_VERSION
    assert error.startswith("mooncake stand-in: TransferEngine cannot run on a lab host (no RDMA device).")
    assert result.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'nixl'"


@pytest.mark.parametrize(
    ("version", "args", "last_error"),
    [
        (
            "0.5.9",
            ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"],
            "ImportError: Please install NIXL by following the instructions at "
            "https://github.com/ai-dynamo/nixl/blob/main/README.md to run SGLang with NixlTransferEngine.",
        ),
        (
            "0.5.9",
            ["--disaggregation-mode", "decode", "--disaggregation-decode-tp", "2"],
            "AssertionError: Cannot set --disaggregation-decode-tp for the decode engine.",
        ),
        (
            "0.5.23",
            ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "fake"],
            "AssertionError: Prefill server does not support 'fake' as the transfer backend",
        ),
    ],
    ids=["nixl-not-installed", "decode-tp-on-decode", "fake-prefill"],
)
def test_what_sglang_refuses_in_pd_mode(
    labs: Callable[..., PDLab], version: str, args: list[str], last_error: str
) -> None:
    lab = labs(version)
    result = lab.run("--model-path", str(lab.target), "--port", str(free_port()), *args)
    assert result.returncode == 1
    assert last_error in result.stderr.splitlines()


# --- the real gateway in front ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("smg") is None, reason="smg (the sglang-router gateway) is not installed")
def test_smg_in_pd_mode_serves_through_the_pair(labs: Callable[..., PDLab], tmp_path: Path) -> None:
    lab = labs()
    prefill, decode, _, decode_log = lab.pair()
    port = free_port()
    cmd = ["smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--pd-disaggregation"]
    cmd += ["--prefill", f"http://127.0.0.1:{prefill.port}", str(lab.bootstrap)]
    cmd += ["--decode", f"http://127.0.0.1:{decode.port}"]
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    with (tmp_path / "smg.log").open("w") as out:
        gateway = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        router = Server(gateway, port)
        deadline = time.monotonic() + 30
        while router.status("/readiness") != 200:
            assert gateway.poll() is None, (tmp_path / "smg.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "smg.log").read_text()[-3000:]
            time.sleep(0.1)
        answer = router.json("POST", "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 12}})
        assert answer["text"] == TWELVE
        chat = {"model": str(lab.target), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        leg = Leg(router, "/v1/chat/completions", {**chat, "stream": True})
        leg.run()
        assert leg.status == 200, leg.data
        *chunks, done = leg.events()
        assert done == "[DONE]"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if isinstance(c, dict))
        assert text == " the lab host serves"
        wait_for_line(decode_log, f"Fetch prefill parallel info from [127.0.0.1:{lab.bootstrap}]")
    finally:
        gateway.kill()
        gateway.wait()


def test_the_rollout_client_registers_each_role_with_smg(labs: Callable[..., PDLab], tmp_path: Path) -> None:
    """roles/sglang_gateway's client (module_utils/orchestrator_gateway.py) puts each worker in with
    its role, a prefill with its bootstrap port; its guard then names the last decode server."""
    from orchestrator.hosts.rotation import client

    lab = labs()
    prefill, decode, _, _ = lab.pair()
    port = free_port()
    cmd = ["smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--pd-disaggregation"]
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    with (tmp_path / "smg.log").open("w") as out:
        gateway = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    p_url, d_url = f"http://127.0.0.1:{prefill.port}", f"http://127.0.0.1:{decode.port}"
    try:
        router = Server(gateway, port)
        deadline = time.monotonic() + 30
        while router.status("/health") != 200:
            assert gateway.poll() is None and time.monotonic() < deadline, (tmp_path / "smg.log").read_text()
            time.sleep(0.1)
        client.add(url, p_url, role="prefill", bootstrap_port=lab.bootstrap, timeout_s=30)
        client.add(url, d_url, role="decode", timeout_s=30)
        listed = {w["url"]: w for w in client.workers(url)}
        assert (listed[p_url]["worker_type"], listed[p_url]["bootstrap_port"]) == ("prefill", lab.bootstrap)
        assert listed[d_url]["worker_type"] == "decode" and "bootstrap_port" not in listed[d_url]
        answer = router.json("POST", "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 12}})
        assert answer["text"] == TWELVE  # the pair serves: smg sent the prefill's bootstrap port
        guard = client.pd_guard(list(listed.values()), d_url, "decode")
        assert guard is not None and "the last decode server in rotation" in guard
        client.remove(url, d_url, timeout_s=30)
        assert client.pd_guard(client.workers(url), p_url, "prefill") is not None  # still the last prefill
        client.add(url, d_url, role="decode", timeout_s=30)  # back, once smg has let it go
        assert client.healthy(client.find(client.workers(url), d_url))
    finally:
        gateway.kill()
        gateway.wait()
