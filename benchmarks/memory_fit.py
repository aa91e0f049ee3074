"""The GPU memory fit (issue #41): predicted per-GPU weights and KV tokens against what the
SGLang stand-in logs, for the shipped profiles at two TP sizes and both shipped SGLang versions;
and the time preflight's fit check adds (reading a 61-shard model directory of sparse files).

The stand-in computes as SGLang does, in its own code (orchestrator/lab/standins/host/sglang):
the prediction (plugins/module_utils/orchestrator_host/memfit.py) never sees its numbers. Both
read the same safetensors headers, which the lab's installer writes over sparse files.

Prints numbers; asserts nothing. Runs on this machine, no lab:
    python3 benchmarks/memory_fit.py [--profiles base,cg_5tok] [--tp 4,8] [--versions 0.5.9,0.5.23]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator import paths
from orchestrator.hosts import playvars
from orchestrator.lab.standins import DIST_PACKAGES, install
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

STANDIN_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
H200_MIB = 143771


def standin_lines(root: Path, argv: list[str], version: str, timeout_s: float = 120) -> tuple[list[str], str]:
    """The stand-in's log of one start of `argv` (until ready or dead): its lines, and how it ended."""
    subprocess.run(
        [STANDIN_PYTHON, "-m", "sglang._set_version", version],
        env={**os.environ, "PYTHONPATH": str(root / DIST_PACKAGES)},
        check=True,
        capture_output=True,
    )
    env = dict(
        os.environ,
        NVIDIA_STANDIN_CONFIG=str(root / "etc/nvidia-standin.json"),
        NVIDIA_STANDIN_RUN_DIR=str(root / "run/nvidia-standin"),
        PYTHONPATH=str(root / DIST_PACKAGES),
        SGLANG_STANDIN_LOAD_DELAY_S="0.1",
        SGLANG_STANDIN_WARMUP_S="0.1",
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    log = root / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([STANDIN_PYTHON, *argv[1:]], env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline, how = time.monotonic() + timeout_s, "timeout"
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if proc.poll() is not None:
            how = f"exited {proc.returncode}"
            break
        if "The server is fired up and ready to roll" in text:
            how = "ready"
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    lines = log.read_text(errors="replace").splitlines()
    if how != "ready":
        last = next((line for line in reversed(lines) if line.strip()), "")
        how += f": {last[:160]}"
    return lines, how


def rooted(argv: list[str], root: Path) -> list[str]:
    """The rendered argv with the profile's host paths under the stand-in's root."""
    return [str(root / a.lstrip("/")) if a.startswith("/data/") else a for a in argv]


def gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:7.2f}"


def tokens(count: int | None) -> str:
    return "-" if count is None else f"{count:>9,}"


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--profiles", default="base,cg_5tok")
    parser.add_argument("--tp", default="4,8")
    parser.add_argument("--versions", default="0.5.9,0.5.23")
    args = parser.parse_args()
    memfit = paths.module_utils("orchestrator_host.memfit")
    modelfiles = paths.module_utils("orchestrator_host.modelfiles")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tic = time.perf_counter()
        install(root, gpus=8)
        print(f"installed the stand-ins and sparse model dirs in {time.perf_counter() - tic:.1f} s")
        scans: dict[str, dict] = {}

        def scanned(path: str) -> dict:
            if path not in scans:
                tic = time.perf_counter()
                scan = modelfiles.scan(str(root / path.lstrip("/")))
                config = (root / path.lstrip("/") / "config.json").read_text()
                scans[path] = {**scan, "config": __import__("json").loads(config)}
                print(
                    f"scan {path}: {scan['shards']} shards, {scan['tensor_bytes'] / 2**30:.1f} GiB of "
                    f"tensors, {len(scan['weights'])} groups, {time.perf_counter() - tic:.2f} s"
                    + (f", error: {scan['error']}" if scan["error"] else "")
                )
            return scans[path]

        head = f"{'profile':<10} {'SGLang':<7} {'TP':>2}  {'weights GiB/GPU':>17}  {'KV tokens':>21}  verdict"
        print("\n" + head + "\n" + " " * 24 + "predicted standin      predicted   standin")
        for name in args.profiles.split(","):
            for version in args.versions.split(","):
                for tp in (int(t) for t in args.tp.split(",")):
                    prof = profile_mod.load(name)
                    data = prof.model_dump(mode="json", exclude_none=True)
                    data["server"] |= {"tp_size": tp, "sglang_version": version}
                    data.pop("extends", None)
                    prof = profile_mod.Profile.model_validate({**data, "name": f"{name}-tp{tp}"})
                    draft_path = prof.speculative.draft_model_path
                    tic = time.perf_counter()
                    target = scanned(prof.server.model_path)
                    draft = scanned(draft_path) if draft_path else None
                    fit = memfit.predict(
                        target, draft, {**playvars.memory_settings(prof), "gpus_available": 8}, H200_MIB
                    )
                    fit_s = time.perf_counter() - tic
                    lines, how = standin_lines(root, rooted(launch.build(prof).argv, root), version)
                    logged = memfit.parse_memory_lines(lines)
                    said = "refused" if fit["problems"] else "fits"
                    print(
                        f"{name:<10} {version:<7} {tp:>2}  "
                        f"{gib(fit['weights_mib'])} {gib(logged['weights_mib'])}"
                        f"  {tokens(fit['kv_tokens'])} {tokens(logged['kv_tokens'])}  "
                        f"predicted {said} ({fit_s * 1000:.0f} ms); stand-in {how}"
                    )
                    for problem in fit["problems"]:
                        print(f"{'':24}problem: {problem}")
        tic = time.perf_counter()
        scans.clear()
        scanned("/data/models/Kimi-K2.5")
        took = time.perf_counter() - tic
        print(f"\npreflight's fit check on the 61-shard Kimi directory (scan + fit): {took:.2f} s")


if __name__ == "__main__":
    main()
