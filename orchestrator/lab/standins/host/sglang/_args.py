"""Command line of the stand-in: exactly the flags of the installed version, plus `--config`.

The parser is built from the real `--help` text of the version in sglang/version.py and the
types SGLang converts values with (the copied orchestrator.profile.sglang_flags does that), so a flag
of another version, or `--max-running-requests x`, fails here as it fails on a real host:
argparse usage and exit 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang import _flags
from sglang.version import __version__

HELP_DIR = Path(__file__).resolve().parent / "_help"
DEFAULT_PORT = 30000
#: --disaggregation-bootstrap-port's default (server_args.py).
DEFAULT_BOOTSTRAP_PORT = 8998


def flag_table(version: str = __version__) -> _flags.FlagTable:
    text = (HELP_DIR / f"launch_server-help-{version}.txt").read_text()
    types = _flags.read_types(HELP_DIR / f"launch_server-types-{version}.json")
    return _flags.FlagTable(version, _flags.parse_help(text), types)


def version_tuple(version: str = __version__) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


# --- --config FILE.yaml ---------------------------------------------------------------


def _scalar(text: str) -> object:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("null", "~", ""):
        return None
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(p) for p in text[1:-1].split(",") if p.strip()]
    return text


def read_yaml_subset(text: str) -> dict[str, object]:
    """`key: value` lines, `# comments`, `[a, b]` and `- item` lists: what an SGLang config needs.

    The hosts have no PyYAML, so a richer file is refused rather than misread.
    """
    data: dict[str, object] = {}
    last_key = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.strip() == "---":
            continue
        stripped = line.strip()
        if stripped.startswith("- ") and last_key is not None:
            current = data.get(last_key)
            data[last_key] = (current if isinstance(current, list) else []) + [_scalar(stripped[2:])]
            continue
        key, colon, value = stripped.partition(":")
        if not colon or line[0].isspace():
            raise ValueError(f"unsupported YAML at line {number}: {raw!r}")
        last_key = key.strip()
        data[last_key] = _scalar(value)
    return data


def config_to_argv(data: dict[str, object]) -> list[str]:
    """YAML keys become flags, as SGLang's own merger does: `api-key: x` -> `--api-key x`."""
    argv: list[str] = []
    for key, value in data.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def merge_config(argv: list[str]) -> list[str]:
    """Replace `--config FILE` by the file's options, placed first so the CLI overrides them."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
        elif arg.startswith("--config="):
            path, rest = arg.split("=", 1)[1], argv[:i] + argv[i + 1 :]
        else:
            continue
        if not path.endswith((".yaml", ".yml")):
            raise ValueError(f"Config file must be YAML format (.yaml/.yml), got: {path}")
        if not Path(path).is_file():
            raise FileNotFoundError(f"Config file not found: {path}")
        return config_to_argv(read_yaml_subset(Path(path).read_text())) + rest
    return argv


# --- resolved arguments ---------------------------------------------------------------


@dataclass
class ServerArgs:
    """The arguments the stand-in acts on, resolved from either version's spellings."""

    raw: argparse.Namespace
    model_path: str
    host: str
    port: int
    tp_size: int
    dp_size: int
    base_gpu_id: int
    mem_fraction_static: float | None
    api_key: str | None
    served_model_name: str
    algorithm: str | None
    draft_model_path: str | None
    steps: int | None
    topk: int | None
    draft_tokens: int | None
    adaptive: bool  # --speculative-adaptive (0.5.23 on; resolved to False where SGLang falls back)
    adaptive_config: str | None  # --speculative-adaptive-config: a JSON file's path
    cuda_graph: bool
    cuda_graph_max_bs: int | None  # --cuda-graph-max-bs (0.5.9), --cuda-graph-max-bs-decode (0.5.23)
    enable_metrics: bool
    max_running_requests: int | None
    context_length: int | None
    nnodes: int
    node_rank: int
    dist_init_addr: str | None  # HOST:PORT of node rank 0's rendezvous (torch's TCPStore)
    dist_timeout: float | None  # seconds; None: the stand-in's dist_timeout_s knob
    decode_log_interval: int
    disaggregation_mode: str = "null"  # --disaggregation-mode: null, prefill or decode
    transfer_backend: str = "mooncake"  # --disaggregation-transfer-backend, resolved (sglang._pd)
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT  # --disaggregation-bootstrap-port

    def as_dict(self) -> dict[str, object]:
        """The server args as /get_server_info shows them: every flag, resolved values on top."""
        shown = {k: v for k, v in vars(self.raw).items()}
        if "speculative_adaptive" in shown:  # the versions whose --help has it
            shown["speculative_adaptive"] = self.adaptive
        shown.update(
            model_path=self.model_path,
            host=self.host,
            port=self.port,
            tp_size=self.tp_size,
            dp_size=self.dp_size,
            base_gpu_id=self.base_gpu_id,
            mem_fraction_static=self.mem_fraction_static,
            served_model_name=self.served_model_name,
            speculative_algorithm=self.algorithm,
            speculative_draft_model_path=self.draft_model_path,
            speculative_num_steps=self.steps,
            speculative_eagle_topk=self.topk,
            speculative_num_draft_tokens=self.draft_tokens,
            disable_cuda_graph=not self.cuda_graph,
            max_running_requests=self.max_running_requests,
            context_length=self.context_length,
            nnodes=self.nnodes,
            node_rank=self.node_rank,
            disaggregation_mode=self.disaggregation_mode,
            disaggregation_transfer_backend=self.transfer_backend,
            disaggregation_bootstrap_port=self.bootstrap_port,
        )
        shown.pop("api_key", None)  # the real server shows it; a lab has no reason to
        return shown


def _get(ns: argparse.Namespace, *names: str) -> object:
    for name in names:
        value = getattr(ns, name, None)
        if value is not None:
            return value
    return None


def _int(value: object, default: int | None = None) -> int | None:
    return default if value is None else int(str(value))


def resolve(ns: argparse.Namespace) -> ServerArgs:
    """Plain values from argparse strings; int()/float() errors surface like SGLang's own."""
    algorithm = _get(ns, "speculative_algorithm")
    mem = _get(ns, "mem_fraction_static")
    model_path = str(_get(ns, "model_path"))
    no_cg = bool(_get(ns, "disable_cuda_graph"))
    dist_timeout = _get(ns, "dist_timeout")
    return ServerArgs(
        raw=ns,
        model_path=model_path,
        host=str(_get(ns, "host") or "127.0.0.1"),
        port=_int(_get(ns, "port"), DEFAULT_PORT) or DEFAULT_PORT,
        tp_size=_int(_get(ns, "tp_size", "tensor_parallel_size"), 1) or 1,
        dp_size=_int(_get(ns, "dp_size", "data_parallel_size"), 1) or 1,
        base_gpu_id=_int(_get(ns, "base_gpu_id"), 0) or 0,
        mem_fraction_static=None if mem is None else float(str(mem)),
        api_key=_get(ns, "api_key"),  # type: ignore[arg-type]
        served_model_name=str(_get(ns, "served_model_name") or model_path),
        algorithm=str(algorithm).upper() if algorithm else None,
        draft_model_path=_get(ns, "speculative_draft_model_path"),  # type: ignore[arg-type]
        steps=_int(_get(ns, "speculative_num_steps")),
        topk=_int(_get(ns, "speculative_eagle_topk")),
        draft_tokens=_int(_get(ns, "speculative_num_draft_tokens")),
        adaptive=bool(_get(ns, "speculative_adaptive")),
        adaptive_config=_get(ns, "speculative_adaptive_config"),  # type: ignore[arg-type]
        cuda_graph=not no_cg,
        cuda_graph_max_bs=_int(_get(ns, "cuda_graph_max_bs", "cuda_graph_max_bs_decode")),
        enable_metrics=bool(_get(ns, "enable_metrics")),
        max_running_requests=_int(_get(ns, "max_running_requests")),
        context_length=_int(_get(ns, "context_length")),
        nnodes=_int(_get(ns, "nnodes"), 1) or 1,
        node_rank=_int(_get(ns, "node_rank"), 0) or 0,
        dist_init_addr=_get(ns, "dist_init_addr"),  # type: ignore[arg-type]
        dist_timeout=None if dist_timeout is None else float(str(dist_timeout)),
        decode_log_interval=_int(_get(ns, "decode_log_interval"), 40) or 40,
        disaggregation_mode=str(_get(ns, "disaggregation_mode") or "null"),
        transfer_backend=str(_get(ns, "disaggregation_transfer_backend") or "mooncake"),
        bootstrap_port=int(str(_get(ns, "disaggregation_bootstrap_port") or DEFAULT_BOOTSTRAP_PORT)),
    )


def parse(argv: list[str]) -> ServerArgs:
    """Parse like the real launch_server: argparse errors print usage and exit 2."""
    parser = _flags.build_parser(flag_table())
    try:
        merged = merge_config(argv)
    except (ValueError, FileNotFoundError) as err:
        parser.print_usage(sys.stderr)
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    return resolve(parser.parse_args(merged))
