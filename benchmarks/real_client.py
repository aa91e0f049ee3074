"""SGLang's own client against the stand-in: `python -m sglang.bench_serving` (0.5.9) and
orchestrator's bench on the same ShareGPT file, output tok/s side by side, at each concurrency.

The issue's bound is 3%: what the real client measures must be what bench measures, or one of
them (or the stand-in's HTTP shapes) is wrong. Prints numbers; asserts nothing.

bench_serving lives in its own venv, outside the repo (it needs transformers, not torch):
    python3 -m venv /work/venvs/sglang059
    /work/venvs/sglang059/bin/pip install --no-deps sglang==0.5.9
    /work/venvs/sglang059/bin/pip install aiohttp numpy pybase64 requests datasets pillow tqdm \
        transformers==4.57.1 IPython pydantic

Usage: python3 benchmarks/real_client.py [--sglang-python PATH] [--endpoint generate|chat]
       [--levels 1,8] [--waves N] [--output-len M] [--base-tok-s S] [--seed S]
--endpoint generate compares `--backend sglang` with bench's /generate (what bench does today);
--endpoint chat compares `--backend sglang-oai-chat` with bench's chat endpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.lab.standins import (
    DIST_PACKAGES,
    KIMI_CHAT_TEMPLATE,
    eagle3_config,
    install,
    kimi_config,
    tokenizer_config,
    write_model_dir,
)
from orchestrator.tuning import bench, datasets

SGLANG_PYTHON_ENV = "SGLANG_BENCH_PYTHON"
AGREE = 0.03  # the bound
STANDIN_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
BACKENDS = {"generate": "sglang", "chat": "sglang-oai-chat"}
#: The tree the lab's EAGLE3 profiles use (tests/unit/test_standin_sglang.py EAGLE3_345).
EAGLE3_345 = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
EAGLE3_345 += ["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "5"]
#: Words the synthetic conversations are made of; meaning does not matter to a speed test.
WORDS = ("model", "server", "token", "decode", "draft", "verify", "cache", "batch", "prompt", "answer")
WORDS += ("request", "stream", "latency", "engineer", "cluster", "kernel", "memory", "tensor", "expert")
#: The venv bench_serving runs from, as one command line (torch is not needed).
VENV = "/work/venvs/sglang059"
INSTALL = (
    f"python3 -m venv {VENV} && {VENV}/bin/pip install --no-deps sglang==0.5.9 && {VENV}/bin/pip install "
    "aiohttp numpy pybase64 requests datasets pillow tqdm transformers==4.57.1 IPython pydantic"
)
DEFAULT_SGLANG_PYTHON = f"{VENV}/bin/python"


# --- inputs ---------------------------------------------------------------------------------


def write_sharegpt(path: Path, rows: int, seed: int) -> None:
    """ShareGPT's shape (`conversations`: human, then gpt), with turns of varied length."""
    rng = random.Random(seed)

    def turn(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    data = [
        {
            "id": f"synthetic-{i}",
            "conversations": [
                {"from": "human", "value": turn(8, 200)},
                # longer than --output-len in any count: both sides generate output-len tokens
                {"from": "gpt", "value": turn(150, 400)},
            ],
        }
        for i in range(rows)
    ]
    path.write_text(json.dumps(data, indent=1) + "\n")


UNK_FLAGS = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}


def write_tokenizer(folder: Path, dataset: Path) -> None:
    """A Hugging Face tokenizer that counts as the stand-in does (one token per whitespace-separated
    word, `count_prompt_tokens`): WordLevel over the dataset's words, split on whitespace, no
    special tokens added. A word not in the vocabulary (the stand-in's own output) is [UNK]:
    still one token. Written as plain JSON so that building it needs no `tokenizers` here;
    `AutoTokenizer.from_pretrained(folder)` loads it offline."""
    turns = [t["value"] for row in json.loads(dataset.read_text()) for t in row["conversations"]]
    words = sorted({w for text in turns for w in text.split()})
    vocab = {"[UNK]": 0, **{w: i for i, w in enumerate(words, 1)}}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 0, "content": "[UNK]", "special": True, **UNK_FLAGS}],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1 << 20}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def first_turns(dataset: Path) -> tuple[str, ...]:
    return tuple(row["conversations"][0]["value"] for row in json.loads(dataset.read_text()))


# --- the stand-in on 127.0.0.1 --------------------------------------------------------------


@dataclasses.dataclass
class Standin:
    root: Path
    base_tok_s: float

    def __post_init__(self) -> None:
        install(self.root, gpus=2, sglang_version="0.5.9")
        # exact: the stand-in's run-to-run noise off, so the two clients see the same server
        fast = {"load_delay_s": 0.2, "warmup_s": 0.4, "base_tok_s": self.base_tok_s, "exact": True}
        chat = tokenizer_config(KIMI_CHAT_TEMPLATE, "[BOS]", "[EOS]")
        self.target = write_model_dir(self.root / "models/target", kimi_config(), chat, **fast)
        self.eagle3 = write_model_dir(self.root / "models/eagle3", eagle3_config(), accept_top1=0.44)
        self.env = dict(
            os.environ,
            NVIDIA_STANDIN_CONFIG=str(self.root / "etc/nvidia-standin.json"),
            NVIDIA_STANDIN_RUN_DIR=str(self.root / "run/nvidia-standin"),
            PYTHONPATH=str(self.root / DIST_PACKAGES),
        )
        self.env.pop("CUDA_VISIBLE_DEVICES", None)

    def flags(self, profile: str) -> list[str]:
        if profile == "eagle3":
            return ["--speculative-draft-model-path", str(self.eagle3), *EAGLE3_345]
        return []

    @contextmanager
    def serving(self, profile: str) -> Iterator[int]:
        """A fresh server for `profile`; yields its port. Its log goes to a file (a pipe nobody
        reads would block it)."""
        port = free_port()
        cmd = [STANDIN_PYTHON, "-m", "sglang.launch_server", "--model-path", str(self.target)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), *self.flags(profile)]
        with (self.root / f"server-{profile}.log").open("w") as log:
            proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, proc)
            yield port
        finally:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the stand-in exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"the stand-in on port {port} was not ready within {timeout_s:.0f} s")


# --- the two clients ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    endpoint: str
    dataset: Path
    tokenizer: Path
    waves: int
    output_len: int
    seed: int
    work: Path

    def requests(self, level: int) -> int:
        """Whole waves of `level` requests: a partial last wave would measure the tail, not the level."""
        return self.waves * level


def bench_serving_tok_s(python: str, run: Run, port: int, level: int) -> float:
    """sglang.bench_serving's "Output token throughput": its output tokens / benchmark duration.

    On the chat backend its output tokens are the tokens it asked for (max_completion_tokens):
    it sends no stream_options, so no usage arrives. What it retokenized from the streamed text
    is checked against that, so a server that stops short does not go unnoticed."""
    out = run.work / f"bench_serving-{run.endpoint}-{port}-{level}.jsonl"
    cmd = [python, "-m", "sglang.bench_serving", "--backend", BACKENDS[run.endpoint]]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--dataset-name", "sharegpt"]
    cmd += ["--dataset-path", str(run.dataset), "--tokenizer", str(run.tokenizer)]
    cmd += ["--num-prompts", str(run.requests(level)), "--max-concurrency", str(level)]
    cmd += ["--sharegpt-output-len", str(run.output_len), "--seed", str(run.seed)]
    cmd += ["--output-file", str(out), "--disable-tqdm"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # the stand-in's `sglang` must not shadow the real one
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=run.work)
    if done.returncode != 0 or not out.exists():
        sys.exit(f"bench_serving failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text().splitlines()[-1])
    if result["completed"] != run.requests(level):
        got = f"{result['completed']} of {run.requests(level)}"
        sys.exit(f"bench_serving: {got} requests completed:\n{done.stdout[-3000:]}")
    if result["total_output_tokens"] != result["total_output_tokens_retokenized"]:
        print(
            f"  bench_serving counted {result['total_output_tokens']} output tokens, the streamed text holds "
            f"{result['total_output_tokens_retokenized']} (tokenizer: one per word)"
        )
    return float(result["output_throughput"])


def orchestrator_tok_s(run: Run, port: int, level: int) -> float:
    """orchestrator's bench engine on the same file: BenchResult.total_tok_s (output tokens over
    the measured phase's wall time), the figure bench_serving's output throughput corresponds to.

    This is the one place to change when `bench --endpoint chat --dataset FILE` lands: the chat
    branch passes the Settings fields that change brings (adjust the names to what it merged)."""
    common = {"requests": run.requests(level), "concurrency": level, "max_tokens": run.output_len}
    # bench_serving warms up with one request of at most 32 tokens
    common |= {"warmup": 1, "warmup_tokens": min(32, run.output_len)}
    if run.endpoint == "generate":
        settings = bench.Settings(**common, prompts=first_turns(run.dataset))
    else:
        chat = {
            "endpoint": "chat",
            "dataset": datasets.load(run.dataset),
            "temperature": 0.0,
            "seed": run.seed,
        }
        settings = bench.Settings(**common, **chat)
    result = bench.run(bench.Target("local", "127.0.0.1", port), settings)
    if result.errors:
        sys.exit(f"orchestrator bench: {len(result.errors)} requests failed: {sorted(set(result.errors))}")
    return result.output_tokens / result.duration_s  # total_tok_s, never None without errors


def listen_overflows() -> int | None:
    """The kernel's count of connections dropped because a listener's accept queue was full
    (TcpExt ListenOverflows): each one costs its client a 1 s SYN retransmit, which no server
    speed explains. None where /proc/net/netstat cannot say."""
    try:
        head, values = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()[:2]]
        return int(dict(zip(head, values, strict=True))["ListenOverflows"])
    except (OSError, ValueError, KeyError):
        return None


# --- the table ------------------------------------------------------------------------------


HEADER = f"{'profile':<8} {'level':>5} {'bench_serving':>15} {'orchestrator':>15} {'ratio':>7}  within 3%?"


def row(profile: str, level: int, theirs: float, ours: float | str) -> str:
    if isinstance(ours, str):
        return f"{profile:<8} {level:>5} {theirs:>15.1f}   {ours}"
    ratio = ours / theirs
    verdict = "yes" if abs(ratio - 1) <= AGREE else "NO"
    return f"{profile:<8} {level:>5} {theirs:>15.1f} {ours:>15.1f} {ratio:>7.3f}  {verdict}"


def sglang_python(arg: str | None) -> str:
    python = arg or os.environ.get(SGLANG_PYTHON_ENV) or DEFAULT_SGLANG_PYTHON
    if not Path(python).exists():
        sys.exit(f"no bench_serving: {python} is missing; install: `{INSTALL}`, or give --sglang-python")
    return python


def parse_args() -> argparse.Namespace:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--sglang-python", help=f"bench_serving's venv Python (else ${SGLANG_PYTHON_ENV})")
    parser.add_argument("--endpoint", choices=sorted(BACKENDS), default="chat")
    parser.add_argument("--levels", default="1,8", help="concurrency levels, comma-separated")
    parser.add_argument("--profiles", default="none,eagle3", help="none (no speculation) and/or eagle3")
    parser.add_argument("--waves", type=int, default=8, help="requests per level and client = waves x level")
    parser.add_argument("--output-len", type=int, default=128, help="tokens per request (ignore_eos)")
    parser.add_argument("--base-tok-s", type=float, default=150.0, help="the stand-in's decode speed")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    python = sglang_python(args.sglang_python)
    with tempfile.TemporaryDirectory(prefix="real-client-") as tmp:
        work = Path(tmp)
        dataset = work / "sharegpt.json"
        levels = [int(v) for v in args.levels.split(",")]
        write_sharegpt(dataset, args.waves * max(levels), args.seed)  # bench_serving takes each row once
        write_tokenizer(work / "tokenizer", dataset)
        run = Run(args.endpoint, dataset, work / "tokenizer", args.waves, args.output_len, args.seed, work)
        standin = Standin(work / "root", args.base_tok_s)
        backend, tokens = BACKENDS[args.endpoint], args.output_len
        print(f"--endpoint {args.endpoint} (bench_serving --backend {backend}), per level")
        print(f"{args.waves} x level requests of {tokens} tokens, stand-in at {args.base_tok_s:g} tok/s")
        print(HEADER)
        dropped_before = listen_overflows()
        for profile in args.profiles.split(","):
            with standin.serving(profile) as port:
                for level in levels:
                    theirs = bench_serving_tok_s(python, run, port, level)
                    ours = orchestrator_tok_s(run, port, level)
                    print(row(profile, level, theirs, ours), flush=True)
        if dropped_before is not None and (dropped := (listen_overflows() or 0) - dropped_before):
            print(f"{dropped} connections overflowed a listen queue meanwhile (1 s each for its request)")


if __name__ == "__main__":
    main()
