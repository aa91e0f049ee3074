"""Logging, fatal errors and model directories of the SGLang stand-in.

Failures print what a user of the real server sees in the journal: a Python traceback
whose last line is the real exception text, then exit 1. The frames are abridged.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SRT = "/usr/local/lib/python3.11/dist-packages/sglang/srt"

#: Defaults of a model dir's standin.json (see docs/standins.md).
STANDIN_DEFAULTS: dict[str, object] = {
    "load_delay_s": 1.0,
    "warmup_s": 0.5,
    "base_tok_s": 90.0,
    "prefill_tok_s": 20000.0,
    "accept_top1": 0.44,
    "hang": False,
    "crash_after_s": None,
    "warmup_error": None,
    "dist_timeout_s": 30.0,
    "run_noise": 0.015,
    "noise_seed": None,
    "host_speed": None,
    "exact": False,
    "trained_on": "chat",
    "read_mib_s": None,
    "shards": 8,
    "draft_load_s": 0.1,
    "capture_s_per_bs": None,
    "draft_capture_s": 0.2,
    "jit_s": 0.0,
    "stall": None,
}
#: Knobs whose value is text, not a number.
TEXT_KNOBS = {"warmup_error", "trained_on", "stall"}
#: Start-up phases the `stall` knob can stop in (see docs/standins.md).
STALL_PHASES = ("init", "weights", "kv_cache", "jit", "graphs", "draft", "draft_graphs", "warmup")
#: When this process started, for the elapsed figures SGLang prints.
START = time.perf_counter()

#: Target architectures whose MTP layers serve as drafter when no draft path is given.
MTP_ARCHS = {"DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM", "BailingMoeForCausalLM"}


def log(message: str, rank: str = "") -> None:
    """One line in SGLang's format: `[2026-11-29 13:00:00 TP0] message`."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{' ' + rank if rank else ''}] {message}", flush=True)


def die(frames: list[tuple[str, int, str, str]], error: str, before: str = "") -> None:
    """Print a traceback ending in `error` (e.g. `ValueError: ...`) to stderr and exit 1."""
    lines = [before] if before else []
    lines.append("Traceback (most recent call last):")
    for path, line, func, source in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(f"    {source}")
    lines.append(error)
    print("\n".join(lines), file=sys.stderr, flush=True)
    raise SystemExit(1)


LAUNCH_FRAME = (
    "/usr/local/lib/python3.11/dist-packages/sglang/launch_server.py",
    29,
    "<module>",
    "server_args = prepare_server_args(sys.argv[1:])",
)


@dataclass
class ModelDir:
    """A model directory as the stand-in sees it: config.json plus its standin.json knobs."""

    path: Path
    config: dict
    standin: dict = field(default_factory=dict)

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def hidden_size(self) -> int:
        text = self.config.get("text_config") or {}
        return int(self.config.get("hidden_size") or text.get("hidden_size") or 4096)

    @property
    def is_eagle3(self) -> bool:
        return any("Eagle3" in a for a in self.architectures)

    def knob(self, key: str) -> object:
        return self.standin.get(key, STANDIN_DEFAULTS[key])


def config_error(path: str) -> str:
    """transformers' message when a model path has no config.json (and the Hub is not an option)."""
    return (
        f"OSError: Can't load the configuration of '{path}'. If you were trying to load it from "
        "'https://huggingface.co/models', make sure you don't have a local directory with the same "
        f"name. Otherwise, make sure '{path}' is the correct path to a directory containing a "
        "config.json file"
    )


def read_model_dir(path: str) -> ModelDir | None:
    """The model at `path`, or None when it has no readable config.json."""
    base = Path(path)
    try:
        config = json.loads((base / "config.json").read_text())
    except (OSError, ValueError):
        return None
    try:
        standin = json.loads((base / "standin.json").read_text())
    except (OSError, ValueError):
        standin = {}
    return ModelDir(base, config, standin)


def env_knobs(model: ModelDir) -> None:
    """Environment overrides (a systemd drop-in can set them): SGLANG_STANDIN_<KEY>."""
    for key, default in STANDIN_DEFAULTS.items():
        value = os.environ.get(f"SGLANG_STANDIN_{key.upper()}")
        if value is None:
            continue
        if isinstance(default, bool):
            model.standin[key] = value.lower() in ("1", "true", "yes")
        elif key in TEXT_KNOBS:
            model.standin[key] = value
        else:
            model.standin[key] = float(value)
