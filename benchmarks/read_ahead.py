"""The downtime of a model switch on the lab, with and without the page-cache read-ahead (issue #41).

A switch deploys profile B (another model) over profile A on lab1. The weights of B come from
storage unless they are in the page cache. The stand-in reads them at its `read_mib_s` knob
(uncached) or at 20,000 MiB/s (cached), asking the kernel which pages are cached, as a real
load's speed follows the page cache. A deploy reads B's files ahead before it stops A
(`--no-read-ahead` turns that off). Before each switch the page cache is dropped
(/proc/sys/vm/drop_caches), so B starts cold.

Downtime: the gap in /health answers (200) on lab1, polled every 0.1 s from this machine.
Prints numbers; asserts nothing. Needs the lab up (`python3 -m orchestrator lab up`):
    python3 benchmarks/read_ahead.py [--gib 6] [--read-mib-s 300] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from orchestrator.lab import nspawn
from orchestrator.lab.standins import llama_tensors, write_model_dir, write_weights

MODELS = ("/data/models/switch-a", "/data/models/switch-b")


def small_llama(gib: float) -> dict:
    """A Llama-style config whose bf16 weights come to about `gib` GiB."""
    layers = max(1, round(gib * 2**30 / (2 * 218_103_808)))  # one 4096-wide layer: 218M parameters
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }


class Health:
    """Polls a /health URL; the longest run of non-200 answers between two 200s is the downtime."""

    def __init__(self, url: str):
        self.url, self.stop = url, threading.Event()
        self.samples: list[tuple[float, bool]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=1) as resp:
                    ok = resp.status == 200
            except OSError:
                ok = False
            self.samples.append((time.monotonic(), ok))
            time.sleep(0.1)

    def downtime(self) -> float:
        self.stop.set()
        self.thread.join()
        gap, last_ok, worst = False, None, 0.0
        for at, ok in self.samples:
            if ok:
                if gap and last_ok is not None:
                    worst = max(worst, at - last_ok)
                last_ok, gap = at, False
            else:
                gap = True
        return worst


def deploy(profile: Path, *more: str) -> tuple[float, dict]:
    tic = time.monotonic()
    argv = [sys.executable, "-m", "orchestrator", "deploy", "-p", str(profile), "--limit", "lab1", "--json"]
    done = subprocess.run(
        [*argv, *more],
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - tic
    try:
        report = json.loads(done.stdout)
    except ValueError:
        sys.exit(f"deploy {profile.name} printed no JSON (rc {done.returncode}): {done.stderr[-2000:]}")
    if done.returncode != 0:
        sys.exit(f"deploy {profile.name} failed: {json.dumps(report)[:2000]}")
    return took, report["hosts"][0]


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--gib", type=float, default=6.0, help="each model's weights (sparse files)")
    parser.add_argument("--read-mib-s", type=float, default=300.0, help="the stand-in's storage speed")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    state = nspawn.up(hosts=4)  # the lab that is up, as it is
    host = next(h for h in state.hosts if h.name == "lab1")
    config = small_llama(args.gib)
    for model in MODELS:
        where = host.rootfs / model.lstrip("/")
        size = write_weights(where, llama_tensors(config), shards=4)
        write_model_dir(where, config, load_delay_s=0.5, warmup_s=0.2, read_mib_s=args.read_mib_s)
    print(f"two models of {size / 2**30:.1f} GiB each (sparse) on lab1; storage {args.read_mib_s:g} MiB/s")
    with tempfile.TemporaryDirectory() as tmp:
        profiles = []
        for name, model in zip(("switch_a", "switch_b"), MODELS, strict=True):
            path = Path(tmp) / f"{name}.yml"
            server = {"model_path": model, "tp_size": 1, "served_model_name": name}
            path.write_text(json.dumps({"extends": "baseline", "server": server}))
            profiles.append(path)
        a, b = profiles
        url = f"http://{host.address}:30000/health"
        print(f"\n{'mode':<14} {'downtime s':>10} {'deploy s':>9} {'read ahead':>22} {'weights phase s':>16}")
        for _ in range(args.repeats):
            for mode, flags in (("no read-ahead", ("--no-read-ahead",)), ("read-ahead", ())):
                deploy(a, "--no-read-ahead")
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
                health = Health(url)
                took, report = deploy(b, *flags)
                down = health.downtime()
                ahead = report.get("read_ahead") or {}
                read = f"{ahead.get('read_bytes', 0) / 2**30:.1f} GiB in {ahead.get('seconds', 0):.1f} s"
                weights = next((p["s"] for p in report.get("phases", []) if p["phase"] == "weights"), None)
                print(f"{mode:<14} {down:>10.1f} {took:>9.1f} {read:>22} {weights!s:>16}")


if __name__ == "__main__":
    main()
