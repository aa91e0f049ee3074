"""The SGLang stand-in behaves like SGLang 0.5.9 / 0.5.23 to a deployment tool.

Each test runs the installed stand-in (install() into a temporary root filesystem) as
`python3 -m sglang.launch_server` on 127.0.0.1, with short load delays; no lab needed.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.lab.standins import (
    DIST_PACKAGES,
    KIMI_CHAT_TEMPLATE,
    eagle1_config,
    eagle3_config,
    install,
    kimi_config,
    set_sglang_version,
    tokenizer_config,
    write_model_dir,
    write_weights,
)

PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
FAST = {"load_delay_s": 0.2, "warmup_s": 0.4}
KIMI_TOKENIZER = tokenizer_config(KIMI_CHAT_TEMPLATE, "[BOS]", "[EOS]")


class Lab:
    """An installed root filesystem plus model dirs, and helpers to run the server from it."""

    def __init__(self, root: Path, version: str = "0.5.9", gpus: int = 2, models: bool = False) -> None:
        install(root, gpus=gpus, sglang_version=version, models=models)  # the lab's models: 0.3 s
        self.root = root
        self.dist = root / DIST_PACKAGES
        self.env = dict(
            os.environ,
            NVIDIA_STANDIN_CONFIG=str(root / "etc/nvidia-standin.json"),
            NVIDIA_STANDIN_RUN_DIR=str(root / "run/nvidia-standin"),
            PYTHONPATH=str(self.dist),
        )
        self.env.pop("CUDA_VISIBLE_DEVICES", None)  # tests set it where they mean it
        self.env["SGLANG_STANDIN_EXACT"] = "1"  # exact figures; noise tests drop it
        self.target = write_model_dir(
            root / "models/target", kimi_config(), KIMI_TOKENIZER, **FAST, base_tok_s=300.0
        )
        self.eagle3 = write_model_dir(root / "models/eagle3", eagle3_config(), accept_top1=0.44)
        self.eagle1 = write_model_dir(root / "models/eagle1", eagle1_config())
        self.procs: list[subprocess.Popen[str]] = []

    def run(self, *args: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        cmd = [PYTHON, "-m", "sglang.launch_server", *args]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, log: Path | None = None) -> Server:
        """`log`: the server's output goes to this file, for a test that sends more requests than a
        pipe nobody reads holds the log lines of (the server would block writing them)."""
        port = free_port()
        cmd = [PYTHON, "-m", "sglang.launch_server", "--model-path", str(self.target), "--port", str(port)]
        with log.open("w") if log else contextlib.nullcontext(subprocess.PIPE) as out:
            proc = subprocess.Popen(
                [*cmd, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True
            )
        self.procs.append(proc)
        return Server(proc, port)

    def smi_used(self) -> list[int]:
        smi = [PYTHON, str(self.root / "usr/bin/nvidia-smi")]
        out = subprocess.run(
            [*smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return [int(v) for v in out.stdout.split()]

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc, self.port = proc, port

    def request(self, method: str, path: str, body: dict | None = None, key: str | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        return conn.getresponse()

    def status(self, path: str = "/health") -> int | None:
        try:
            resp = self.request("GET", path)
            resp.read()
            return resp.status
        except OSError:
            return None  # port not bound yet

    def wait_ready(self, timeout: float = 10) -> list[int | None]:
        """Poll /health until 200; returns the statuses seen (None: connection refused)."""
        seen: list[int | None] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen.append(self.status())
            if seen[-1] == 200:
                return seen
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            time.sleep(0.05)
        raise AssertionError(f"not ready: {seen[-5:]}")

    def json(self, method: str, path: str, body: dict | None = None, key: str | None = None) -> dict:
        resp = self.request(method, path, body, key)
        assert resp.status == 200, resp.read()
        return json.loads(resp.read())

    def stop(self) -> str:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, and never one given before in this run: a stand-in binds
    its port only after loading, so two asked for in a row could otherwise be the same one."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def speed_module(lab: Lab):
    spec = importlib.util.spec_from_file_location("standin_speed", lab.dist / "sglang/_speed.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    yield lab
    lab.close()


EAGLE3_345 = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
EAGLE3_345 += ["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "5"]


# --- failures before serving -----------------------------------------------------------


def test_unknown_flag_is_an_argparse_error(lab: Lab) -> None:
    result = lab.run("--model-path", str(lab.target), "--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: python -m sglang.launch_server")
    assert "error: unrecognized arguments: --no-such-flag" in result.stderr


def test_0_5_23_rejects_the_old_cuda_graph_flag_as_ambiguous(tmp_path: Path) -> None:
    lab = Lab(tmp_path, version="0.5.23")
    result = lab.run("--model-path", str(lab.target), "--cuda-graph-max-bs", "8")
    assert result.returncode == 2
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode" in result.stderr


def test_a_value_of_the_wrong_type_is_an_argparse_error(lab: Lab) -> None:
    """SGLang declares --max-running-requests type=int; the stand-in reads the same types table."""
    result = lab.run("--model-path", str(lab.target), "--max-running-requests", "x")
    assert result.returncode == 2
    assert "error: argument --max-running-requests: invalid int value: 'x'" in result.stderr


def test_missing_model_path(lab: Lab) -> None:
    result = lab.run("--model-path", "/data/models/nope")
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith("OSError: Can't load the configuration of '/data/models/nope'")


def test_eagle3_without_a_drafter(lab: Lab) -> None:
    result = lab.run("--model-path", str(lab.target), *EAGLE3_345)
    assert result.returncode == 1
    assert "model_path=server_args.speculative_draft_model_path" in result.stderr
    assert "OSError: None is not a local folder" in result.stderr


def test_some_but_not_all_tree_settings_is_a_bare_assertion(lab: Lab) -> None:
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(lab.eagle3)]
    result = lab.run("--model-path", str(lab.target), *args, "--speculative-num-steps", "3")
    assert (result.returncode, result.stderr.splitlines()[-1]) == (1, "AssertionError")


def test_mem_fraction_above_0_95_runs_out_of_memory(lab: Lab) -> None:
    result = lab.run("--model-path", str(lab.target), "--mem-fraction-static", "0.97")
    assert result.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in result.stderr
    assert "GPU 0 has a total capacity of 139.81 GiB" in result.stderr
    assert "Capture cuda graph failed" in result.stderr


def test_a_foreign_holder_on_one_of_the_gpus_is_sglangs_unbalanced_memory(lab: Lab) -> None:
    """SGLang refuses ranks whose free memory differs by more than 10%
    (SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK is on by default)."""
    hold = [PYTHON, "-m", "nvidia_standin.hold", "--gpu", "1", "--mib", "40000"]
    holder = subprocess.Popen(hold, env=lab.env, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        result = lab.run("--model-path", str(lab.target), "--tp-size", "2", "--mem-fraction-static", "0.8")
        assert result.returncode == 1
        assert (
            "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
            "min_per_gpu_memory=98.23828125, local_gpu_memory=137.3095703125" in result.stderr
        )
        lab.start("--base-gpu-id", "0", "--mem-fraction-static", "0.8").wait_ready()  # GPU 0 is free
    finally:
        holder.kill()
        holder.wait()


def test_too_few_gpus(lab: Lab) -> None:
    result = lab.run("--model-path", str(lab.target), "--tp-size", "2", "--base-gpu-id", "1")
    assert result.returncode == 1
    assert "CUDA error: invalid device ordinal" in result.stderr


# --- CUDA_VISIBLE_DEVICES: logical GPU i is the i-th visible one; nvidia-smi counts physical ---------


@pytest.mark.parametrize(
    ("visible", "args"),
    [
        ("1", ["--tp-size", "2"]),  # one visible GPU for two ranks
        ("0,1", ["--tp-size", "2", "--base-gpu-id", "1"]),  # base_gpu_id counts within the visible list
        ("0,7", ["--tp-size", "2"]),  # 7 is not on this 2-GPU host: CUDA sees only GPU 0
        ("", []),  # set but empty: no GPU at all
    ],
)
def test_a_logical_gpu_past_the_visible_ones_is_an_invalid_ordinal(lab: Lab, visible, args) -> None:
    lab.env["CUDA_VISIBLE_DEVICES"] = visible
    result = lab.run("--model-path", str(lab.target), *args)
    assert result.returncode == 1
    assert "CUDA error: invalid device ordinal" in result.stderr


def test_memory_lands_on_the_visible_gpus_nvidia_smi_numbers(tmp_path: Path) -> None:
    lab = Lab(tmp_path, gpus=8)
    try:
        lab.env["CUDA_VISIBLE_DEVICES"] = "6,7,4"
        server = lab.start("--tp-size", "2", "--base-gpu-id", "1", "--mem-fraction-static", "0.5")
        server.wait_ready()  # logical GPUs 1 and 2: physical 7 and 4
        from tests.unit.test_standin_memory import weightless_used_mib  # it imports this module

        used = weightless_used_mib(0.5)
        assert lab.smi_used() == [0, 0, 0, 0, used, 0, 0, used]
        server.stop()
        assert lab.smi_used() == [0] * 8
    finally:
        lab.close()


def test_out_of_memory_names_the_gpu_by_its_logical_index(lab: Lab) -> None:
    hold = [PYTHON, "-m", "nvidia_standin.hold", "--gpu", "1", "--mib", "40000"]
    holder = subprocess.Popen(hold, env=lab.env, stdout=subprocess.PIPE)
    big = [(f"model.layers.{i}.mlp.down_proj.weight", "BF16", (8192, 65536)) for i in range(110)]
    write_weights(lab.target, big)  # 110 GiB: more than the 99.7 GiB the holder leaves
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        lab.env["CUDA_VISIBLE_DEVICES"] = "1,0"  # physical GPU 1, held by another process, is logical 0
        result = lab.run("--model-path", str(lab.target), "--mem-fraction-static", "0.8")
        assert result.returncode == 1
        assert "GPU 0 has a total capacity of 139.81 GiB" in result.stderr
        assert f"Process {holder.pid} has" in result.stderr
        lab.env["CUDA_VISIBLE_DEVICES"] = "0,1"  # the same GPU as logical 1, through --base-gpu-id
        args = ["--mem-fraction-static", "0.8", "--base-gpu-id", "1"]
        result = lab.run("--model-path", str(lab.target), *args)
        assert result.returncode == 1
        assert "GPU 1 has a total capacity of 139.81 GiB" in result.stderr
        assert f"Process {holder.pid} has" in result.stderr
    finally:
        holder.kill()
        holder.wait()


# --- serving -----------------------------------------------------------------------------


def test_start_health_memory_and_stop(lab: Lab) -> None:
    server = lab.start("--tp-size", "2", "--mem-fraction-static", "0.5")
    seen = server.wait_ready()
    assert seen[0] is None and 503 in seen  # port closed while loading, then warm-up
    from tests.unit.test_standin_memory import weightless_used_mib  # it imports this module

    # context, KV pool and graphs, + the driver's 3 + 6 MiB for one process
    assert lab.smi_used() == [weightless_used_mib(0.5)] * 2
    out = server.stop()
    assert server.proc.returncode == 0
    assert "The server is fired up and ready to roll!" in out
    assert lab.smi_used() == [0, 0]


def test_stream_ends_with_done_and_meta_info(lab: Lab) -> None:
    server = lab.start("--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345)
    server.wait_ready()
    body = {
        "text": "hello there",
        "sampling_params": {"max_new_tokens": 20, "temperature": 0},
        "stream": True,
    }
    events = server.request("POST", "/generate", body).read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    last = json.loads(events[-3].removeprefix("data: "))
    assert last["meta_info"]["completion_tokens"] == 20 and last["meta_info"]["spec_verify_ct"] == 10
    whole = server.json("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 5}})
    assert whole["meta_info"]["completion_tokens"] == 5 and len(whole["text"].split()) == 5
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    lines = server.request("POST", "/v1/chat/completions", chat).read().decode().split("\n\n")
    assert lines[-2] == "data: [DONE]" and '"finish_reason": "length"' in lines[-3]


@pytest.mark.parametrize("profile", [[], EAGLE3_345], ids=["no-spec", "eagle3-3-4-5"])
def test_streamed_tokens_per_second_match_the_model(lab: Lab, profile: list[str]) -> None:
    extra = ["--speculative-draft-model-path", str(lab.eagle3)] if profile else []
    server = lab.start(*profile, *extra)
    server.wait_ready()
    speed = speed_module(lab)
    spec = speed.SpecSettings(3, 4, 5) if profile else None
    predicted = speed.decode_model(300.0, spec, True).tok_s
    body = {"text": "x", "sampling_params": {"max_new_tokens": 240, "temperature": 0}, "stream": True}
    resp = server.request("POST", "/generate", body)
    start = time.monotonic()
    resp.read()
    measured = 240 / (time.monotonic() - start)
    assert measured == pytest.approx(predicted, rel=0.03)


def test_eagle3_drafter_under_eagle_accepts_nothing(lab: Lab) -> None:
    args = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(lab.eagle3)]
    server = lab.start(
        *args,
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
        "--speculative-num-draft-tokens",
        "5",
        "--decode-log-interval",
        "5",
    )
    server.wait_ready()
    assert "avg_spec_accept_length" not in server.json("GET", "/get_server_info")["internal_states"][0]
    server.json("POST", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10}})
    info = server.json("GET", "/get_server_info")  # the real one has the figure once a decode log ran
    assert info["internal_states"][0]["avg_spec_accept_length"] == 1.0
    assert "accept len: 1.00, accept rate: 0.00, cuda graph: True" in server.stop()


def test_eagle3_algorithm_with_an_eagle1_drafter_dies_in_graph_capture(lab: Lab) -> None:
    args = ["--speculative-draft-model-path", str(lab.eagle1), *EAGLE3_345]
    result = lab.run("--model-path", str(lab.target), *args)
    assert result.returncode == 1
    failure = "Capture cuda graph failed: mat1 and mat2 shapes cannot be multiplied (4x21504 and 14336x7168)"
    assert failure in result.stderr


def test_api_key_from_config_file_and_open_health(lab: Lab, tmp_path: Path) -> None:
    config = tmp_path / "sglang.yaml"
    config.write_text("# secrets live here\napi-key: secret\nenable-metrics: true\n")
    server = lab.start("--config", str(config))
    server.wait_ready()
    body = {"text": "x", "sampling_params": {"max_new_tokens": 1}}
    assert server.request("POST", "/generate", body).status == 401
    assert server.json("POST", "/generate", body, key="secret")["meta_info"]["completion_tokens"] == 1
    assert server.status("/health_generate") == 200
    metrics = server.request("GET", "/metrics").read().decode()
    assert "sglang:gen_throughput{" in metrics and "sglang:spec_accept_length{" in metrics
    assert server.status("/server_info") == 404  # 0.5.9 has only /get_server_info


def test_get_load_counts_the_requests_in_flight_on_rank_0(lab: Lab) -> None:
    """SGLang's /get_load, which the gateway's load-aware policies read: one entry per DP rank."""
    server = lab.start("--dp-size", "2")
    server.wait_ready()
    idle = [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0},
        {"dp_rank": 1, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0},
    ]
    assert server.json("GET", "/get_load") == idle
    body = {"text": "one two three", "sampling_params": {"max_new_tokens": 300}, "stream": True}
    streams = [server.request("POST", "/generate", body) for _ in range(3)]
    for resp in streams:
        assert resp.read(6) == b"data: "  # the first decode round came: the request is running
    busy = server.json("GET", "/get_load")
    assert [load["num_reqs"] for load in busy] == [3, 0]
    assert busy[0]["num_waiting_reqs"] == 0 and busy[0]["num_tokens"] >= 3 * 3  # the prompts at least
    for resp in streams:
        assert resp.read().decode().endswith("data: [DONE]\n\n")
    assert server.json("GET", "/get_load") == idle


def test_get_load_needs_the_api_key(lab: Lab) -> None:
    server = lab.start("--api-key", "secret")
    server.wait_ready()
    resp = server.request("GET", "/get_load")
    assert (resp.status, json.loads(resp.read())) == (401, {"error": "Unauthorized"})
    assert server.json("GET", "/get_load", key="secret")[0]["num_reqs"] == 0


def test_version_switch_over_ssh_style_command(lab: Lab) -> None:
    switch = [PYTHON, "-m", "sglang._set_version", "0.5.23"]
    subprocess.run(switch, env=lab.env, check=True)
    code = "import importlib.metadata as m, sglang; print(sglang.__version__, m.version('sglang'))"
    probe = [PYTHON, "-c", code]
    assert subprocess.run(probe, env=lab.env, capture_output=True, text=True).stdout == "0.5.23 0.5.23\n"
    assert lab.run("--model-path", str(lab.target), "--cuda-graph-max-bs", "8").returncode == 2
    set_sglang_version(lab.root, "0.5.9")
    assert subprocess.run(probe, env=lab.env, capture_output=True, text=True).stdout == "0.5.9 0.5.9\n"


# --- OpenAI endpoints, chat template, per-request acceptance ---------------------------------

CODE_PROMPT = "```python\ndef add(a, b):\n    return a + b\n```\nWrite tests for this function."


def events_of(resp) -> list[dict]:
    chunks = resp.read().decode().split("\n\n")
    assert chunks[-2:] == ["data: [DONE]", ""]
    return [json.loads(c.removeprefix("data: ")) for c in chunks[:-2]]


def test_chat_goes_through_the_models_template_and_counts_it_in_usage(lab: Lab) -> None:
    server = lab.start()
    server.wait_ready()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    usage = server.json("POST", "/v1/chat/completions", chat)["usage"]
    # <|im_system|>system<|im_middle|>You are Kimi, ...<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|>
    # <|im_assistant|>assistant<|im_middle|>: 11 special tokens, 11 words
    assert usage == {"prompt_tokens": 22, "completion_tokens": 3, "total_tokens": 25}
    raw = server.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert raw["usage"]["prompt_tokens"] == 1 and raw["object"] == "text_completion"
    streamed = events_of(
        server.request(
            "POST",
            "/v1/chat/completions",
            {**chat, "stream": True, "stream_options": {"include_usage": True}},
        )
    )
    assert streamed[-1]["choices"] == [] and streamed[-1]["usage"] == usage
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in streamed[:-1]).split() != []
    bench_style = {
        "model": "x",
        "prompt": "hi",
        "temperature": 0.0,
        "best_of": 1,
        "max_tokens": 4,
        "stream": True,
        "ignore_eos": True,
    }
    texts = [
        e["choices"][0]["text"] for e in events_of(server.request("POST", "/v1/completions", bench_style))
    ]
    assert len("".join(texts).split()) == 4


def test_a_model_folder_without_a_chat_template_is_a_400_not_a_crash(lab: Lab) -> None:
    lab.target = write_model_dir(lab.root / "models/bare", kimi_config(), **FAST)
    server = lab.start()
    server.wait_ready()
    resp = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    body = json.loads(resp.read())
    assert (resp.status, body["object"], body["code"]) == (400, "error", 400)
    assert "tokenizer.chat_template is not set" in body["message"]
    assert (
        server.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})["usage"][
            "completion_tokens"
        ]
        == 2
    )


def test_each_request_accepts_by_its_prompt_and_temperature(lab: Lab) -> None:
    server = lab.start(
        "--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345, "--decode-log-interval", "10"
    )
    server.wait_ready()

    def accept(text: str, temperature: float) -> float:
        body = {"text": text, "sampling_params": {"max_new_tokens": 60, "temperature": temperature}}
        meta = server.json("POST", "/generate", body)["meta_info"]
        assert meta["spec_accept_length"] == meta["completion_tokens"] / meta["spec_verify_ct"]
        assert 0 < meta["spec_accept_rate"] <= 1 and "spec_accept_histogram" not in meta  # 0.5.9
        return meta["spec_accept_length"]

    code, plain, hot = (
        accept(CODE_PROMPT, 0),
        accept("Tell me about maps.", 0),
        accept("Tell me about maps.", 1),
    )
    assert code > plain > hot
    info = server.json("GET", "/get_server_info")["internal_states"][0]
    assert hot < info["avg_spec_accept_length"] < code  # the lifetime mean of what was decoded


def test_the_newer_version_adds_the_accept_histogram_to_meta_info(tmp_path: Path) -> None:
    lab = Lab(tmp_path, version="0.5.23")
    try:
        server = lab.start("--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345)
        server.wait_ready()
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 40, "temperature": 0}}
        meta = server.json("POST", "/generate", body)["meta_info"]
        histogram = meta["spec_accept_histogram"]  # rounds that accepted 0, 1, 2, ... draft tokens
        assert sum(histogram) == meta["spec_verify_ct"]
        assert sum(i * n for i, n in enumerate(histogram)) == meta["spec_accept_token_num"]
    finally:
        lab.close()
