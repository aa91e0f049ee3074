"""Rules that span several fields of a profile, each naming the field and the fix.

SGLang does not check these itself, or checks them badly:
- The speculative trio (num_steps, eagle_topk, num_draft_tokens) is all or none. With only some,
  SGLang dies on a bare AssertionError.
- With eagle_topk 1, SGLang silently replaces num_draft_tokens by num_steps + 1. And
  num_draft_tokens > num_steps * eagle_topk + 1 is not a meaningful draft tree.
- EAGLE3 needs a draft model path. So do EAGLE, its alias NEXTN, and STANDALONE.
- Flags drift between versions. 0.5.23 has no --cuda-graph-max-bs, and argparse calls that
  spelling ambiguous. A flag argparse rejects is exit 2 after start. And argparse takes any unique
  prefix, so `--api-k KEY` is `--api-key KEY`.
- Some settings SGLang refuses only after reading the model: DP attention with a tp_size it does
  not divide, STANDALONE or NGRAM with DP attention, top-k > 1 over pages. NGRAM also silently
  overwrites eagle_topk.
- NCCL ignores NCCL_* names it does not know, so a typo silently does nothing.
- Adaptive speculative decoding (0.5.23) falls back to static settings, with one warning line,
  for an algorithm other than EAGLE/EAGLE3, top-k > 1, attention DP and a few other features.
  It silently forces num_draft_tokens to num_steps + 1.

The rules take plain values, not the profile's models. So this module depends on nothing of the
profile. model.py calls the rules, never the other way round.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Any

from orchestrator.profile import sglang_flags

Finding = tuple[str, str]  # (field.path, message)

NEEDS_DRAFT_MODEL = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"}

#: NCCL's documented environment variables. NCCL ignores any other NCCL_* name without a
#: word, so a typo (NCCL_PROTOCOL) would silently do nothing: we refuse it instead.
KNOWN_NCCL = frozenset(
    """
    NCCL_ALGO NCCL_PROTO NCCL_P2P_LEVEL NCCL_P2P_DISABLE NCCL_P2P_DIRECT_DISABLE NCCL_P2P_PXN_LEVEL
    NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_LL_THRESHOLD NCCL_PXN_DISABLE
    NCCL_MIN_NCHANNELS NCCL_MAX_NCHANNELS NCCL_MIN_P2P_NCHANNELS NCCL_MAX_P2P_NCHANNELS
    NCCL_NCHANNELS_PER_NET_PEER NCCL_MIN_CTAS NCCL_MAX_CTAS NCCL_CTA_POLICY NCCL_BUFFSIZE
    NCCL_NTHREADS NCCL_SHM_DISABLE NCCL_NVB_DISABLE NCCL_NVLS_ENABLE NCCL_NVLS_CHUNKSIZE
    NCCL_NVLS_NCHANNELS NCCL_MNNVL_ENABLE NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_DEBUG
    NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_SET_THREAD_NAME NCCL_CONF_FILE NCCL_SOCKET_IFNAME
    NCCL_SOCKET_FAMILY NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_SOCKET_RETRY_CNT
    NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_CROSS_NIC NCCL_IB_DISABLE NCCL_IB_HCA NCCL_IB_TIMEOUT
    NCCL_IB_RETRY_CNT NCCL_IB_GID_INDEX NCCL_IB_ADDR_FAMILY NCCL_IB_ADDR_RANGE
    NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_TC NCCL_IB_FIFO_TC NCCL_IB_RETURN_ASYNC_EVENTS
    NCCL_IB_QPS_PER_CONNECTION NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_ADAPTIVE_ROUTING
    NCCL_IB_AR_THRESHOLD NCCL_IB_ECE_ENABLE NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_MERGE_NICS
    NCCL_IB_MERGE_VFS NCCL_IB_USE_INLINE NCCL_IB_CUDA_SUPPORT NCCL_IBEXT_DISABLE NCCL_NET
    NCCL_NET_PLUGIN NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_SHARED_BUFFERS
    NCCL_NET_SHARED_COMMS NCCL_NET_FORCE_FLUSH NCCL_NET_OVERHEAD NCCL_GDRCOPY_ENABLE
    NCCL_DMABUF_ENABLE NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_UID_STAGGER_THRESHOLD
    NCCL_UID_STAGGER_RATE NCCL_TUNER_PLUGIN NCCL_PROFILER_PLUGIN NCCL_ENV_PLUGIN
    NCCL_IGNORE_CPU_AFFINITY NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD NCCL_TOPO_FILE
    NCCL_TOPO_DUMP_FILE NCCL_CHECKS_DISABLE NCCL_CHECK_POINTERS NCCL_LAUNCH_MODE
    NCCL_SINGLE_RING_THRESHOLD NCCL_LL_THRESHOLD NCCL_TREE_THRESHOLD NCCL_RUNTIME_CONNECT
    NCCL_GRAPH_REGISTER NCCL_LOCAL_REGISTER NCCL_LEGACY_CUDA_REGISTER NCCL_SET_STACK_SIZE
    NCCL_GRAPH_MIXING_SUPPORT NCCL_RAS_ENABLE NCCL_RAS_ADDR NCCL_RAS_TIMEOUT_FACTOR
    NCCL_COMM_BLOCKING NCCL_WORK_FIFO_DEPTH NCCL_WIN_ENABLE NCCL_ALLOC_P2P_NET_LL_BUFFERS
    """.split()  # noqa: SIM905 (a word list reads better than 100 quoted strings)
)

_PROTOS = {"LL", "LL128", "SIMPLE"}
_ALGOS = {"RING", "TREE", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT"}
_P2P_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"}
_NTHREADS = {"64", "128", "256", "512"}
_DEBUG = {"VERSION", "WARN", "INFO", "TRACE"}
_INT64_MAX = 2**63 - 1  # NCCL reads sizes into int64_t
_POSITIVE_INT = {
    "NCCL_BUFFSIZE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
}


# --- speculative ---------------------------------------------------------------------


def check_speculative(
    *,
    algorithm: str | None,
    draft_model_path: str | None,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    adaptive: dict[str, Any] | None = None,
) -> Iterator[Finding]:
    """The `speculative` section's fields, by name."""
    if adaptive is not None and algorithm is not None:
        yield from check_adaptive(adaptive, algorithm, num_steps, eagle_topk, num_draft_tokens)
    if algorithm == "NGRAM":  # no draft tree of its own: the trio rules do not apply
        yield from _ngram_overwrites(num_steps, eagle_topk, num_draft_tokens, draft_model_path)
        return
    trio = {"num_steps": num_steps, "eagle_topk": eagle_topk, "num_draft_tokens": num_draft_tokens}
    given = [k for k, v in trio.items() if v is not None]
    if adaptive is not None:
        given += ["adaptive"]
    # Adaptive resolves each of the three on its own (0.5.23 speculative_hook skips the
    # all-or-none choice for it): check_adaptive has its rules.
    if given and len(given) < 3 and adaptive is None:
        missing = ", ".join(k for k in trio if k not in given)
        yield (
            "speculative",
            f"give num_steps, eagle_topk and num_draft_tokens together or none of them "
            f"(missing: {missing}); SGLang dies on a bare AssertionError otherwise",
        )
    if algorithm is None:
        if draft_model_path is not None:
            yield ("speculative.algorithm", "draft_model_path is set but no algorithm; set algorithm: EAGLE3")
        elif given:
            yield ("speculative.algorithm", f"{', '.join(given)} set but no algorithm; set algorithm: EAGLE3")
        return
    if algorithm in NEEDS_DRAFT_MODEL and draft_model_path is None:
        yield (
            "speculative.draft_model_path",
            f"algorithm {algorithm} needs a draft model; set draft_model_path",
        )
    if len(given) < 3 or adaptive is not None:
        return
    steps, topk, draft = num_steps, eagle_topk, num_draft_tokens
    assert steps is not None and topk is not None and draft is not None
    if topk == 1 and draft != steps + 1:
        yield (
            "speculative.num_draft_tokens",
            f"with eagle_topk 1 SGLang silently replaces num_draft_tokens {draft} by num_steps + 1 = "
            f"{steps + 1}; set num_draft_tokens: {steps + 1}",
        )
    elif draft > steps * topk + 1:
        yield (
            "speculative.num_draft_tokens",
            f"{draft} exceeds num_steps x eagle_topk + 1 = {steps * topk + 1}: not a meaningful draft tree; "
            f"lower num_draft_tokens to at most {steps * topk + 1} or raise num_steps/eagle_topk",
        )


#: SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG (speculative/adaptive_spec_params.py), used without
#: --speculative-adaptive-config: the smallest batch size of each tier -> its candidate steps.
DEFAULT_ADAPTIVE_TIERS: dict[int, list[int]] = {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
#: The first SGLang release whose adaptive config and rules orchestrator follows.
ADAPTIVE_FROM = "0.5.23"
#: Algorithms SGLang runs adaptive with (NEXTN is EAGLE there); any other falls back to static.
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
#: The line SGLang logs when it switches adaptive off (speculative_hook.py), for its `reason`.
ADAPTIVE_FALLBACK = "speculative_adaptive disabled: {}. Falling back to static speculative params."


def adaptive_candidates(tiers: dict[int, list[int]] | None) -> list[int]:
    """Every tier's steps together, ascending: the values --speculative-num-steps may take."""
    chosen = DEFAULT_ADAPTIVE_TIERS if tiers is None else tiers
    return sorted({step for steps in chosen.values() for step in steps})


def adaptive_start_steps(tiers: dict[int, list[int]] | None, num_steps: int | None) -> int:
    """The steps SGLang starts from: num_steps, else the middle of adaptive_candidates."""
    if num_steps is not None:
        return num_steps
    candidates = adaptive_candidates(tiers)
    return candidates[len(candidates) // 2]


def check_adaptive(
    adaptive: dict[str, Any],
    algorithm: str,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
) -> Iterator[Finding]:
    """speculative.adaptive against the other speculative fields, as SGLang 0.5.23 reads them
    (speculative_hook._init_adaptive_speculative_params, adaptive_spec_params._maybe_disable_adaptive)."""
    if algorithm not in ADAPTIVE_ALGORITHMS:
        reason = f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
        yield (
            "speculative.adaptive",
            f"SGLang runs {algorithm} static: '{ADAPTIVE_FALLBACK.format(reason)}'; "
            "use algorithm EAGLE3, EAGLE or NEXTN, or drop adaptive",
        )
        return
    if eagle_topk is not None and eagle_topk != 1:
        reason = f"speculative_eagle_topk={eagle_topk} (only topk=1 is supported)"
        yield (
            "speculative.eagle_topk",
            f"SGLang would silently run static settings: '{ADAPTIVE_FALLBACK.format(reason)}'; "
            "set eagle_topk: 1 or leave it out (adaptive tiers draft a chain)",
        )
    tiers = adaptive.get("tiers")
    knobs = sorted(k for k, v in adaptive.items() if k != "tiers" and v is not None)
    if knobs and tiers is None:
        default = ", ".join(f"{size}: {steps}" for size, steps in DEFAULT_ADAPTIVE_TIERS.items())
        yield (
            "speculative.adaptive.tiers",
            f"{', '.join(knobs)} reach SGLang only in a config file, which must list its tiers: give tiers "
            f"(SGLang's default: {{{default}}}) or drop {', '.join(knobs)}",
        )
    candidates = adaptive_candidates(tiers)
    if num_steps is not None and num_steps not in candidates:
        yield (
            "speculative.num_steps",
            f"SGLang refuses it at start: '--speculative-num-steps={num_steps} is not in the adaptive "
            f"config candidate_steps {candidates}. Pass one of those values.' (or leave num_steps out)",
        )
        return
    start = adaptive_start_steps(tiers, num_steps)
    if num_draft_tokens is not None and num_draft_tokens != start + 1:
        yield (
            "speculative.num_draft_tokens",
            f"with adaptive SGLang sets num_draft_tokens to each tier's num_steps + 1 ({start + 1} at the "
            f"start), whatever is given: leave num_draft_tokens out",
        )


# --- server --------------------------------------------------------------------------


def check_server(
    *,
    sglang_version: str,
    cuda_graph: bool,
    cuda_graph_max_bs: int | None,
    served_model_name: str | None,
    extra_args: list[str],
) -> Iterator[Finding]:
    """The `server` section's fields that the rules read, by name."""
    if not cuda_graph and cuda_graph_max_bs is not None:
        yield (
            "server.cuda_graph_max_bs",
            "has no effect with cuda_graph: false; remove it or enable cuda_graph",
        )
    wanted = {"cuda_graph_max_bs": cuda_graph_max_bs, "served_model_name": served_model_name}
    for setting, value in wanted.items():
        if value is not None and sglang_flags.flag(setting, sglang_version) is None:
            yield (
                f"server.{setting}",
                f"SGLang {sglang_version} has no flag for this; remove it or change sglang_version",
            )
    yield from check_extra_args(sglang_version, extra_args)


def _secret_finding(shown: str, canonical: str) -> str:
    """A secret on argv is readable by every local user (/proc/PID/cmdline), and in the 0644 unit."""
    text = (
        f"{shown}: never put a secret inline (argv and the unit file are world-readable); "
        "use api_key: {file: PATH} or {env: NAME}, which reaches SGLang in a 0600 --config file"
    )
    if canonical == "--api-key":
        return text
    return f"{text}; it carries --api-key only, so leave {canonical} out"


def check_extra_args(version: str, extra_args: list[str]) -> Iterator[Finding]:
    """Each extra flag as SGLang's argparse reads it (prefixes, `=`, values, choices, stray words),
    refusing secrets, `--help` and modelled settings."""
    modelled = sglang_flags.modelled_flag_names(version)
    for arg in sglang_flags.read_args(version, extra_args):
        loc = f"server.extra_args[{arg.index}]"
        opt = arg.option
        name = arg.name
        shown = (
            name if opt is None or name in opt.names else f"{name} (SGLang reads it as {_spelled(opt, name)})"
        )
        if opt is not None and set(opt.names) & set(sglang_flags.SECRET_FLAGS):
            # First, and alone: no other message may echo the value.
            yield (loc, _secret_finding(shown, opt.names[0]))
            continue
        if arg.error is not None:
            kind = sglang_flags.value_kind(version, arg)
            finding = _argparse_finding(version, arg.error)
            yield (loc, f"{finding}; SGLang reads this flag's value as {kind}" if kind else finding)
        elif arg.unknown:
            close = difflib.get_close_matches(name, sglang_flags.flag_table(version).names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            yield (loc, f"{name} is not a flag of {sglang_flags.named(version)}{hint}")
        elif opt is not None and "--help" in opt.names:
            yield (loc, f"{shown} prints SGLang's help and exits: the server would never start; remove it")
        elif opt is not None and modelled.intersection(opt.names):
            yield (loc, f"{shown} duplicates a modelled setting; set it in the profile's fields instead")
        elif opt is not None and GPU_FLAGS.intersection(opt.names):
            yield (
                loc,
                f"{shown} moves the server off the GPUs that preflight, the idle check, --kill-gpu-holders, "
                "status and verify look at: choose the GPUs with server.gpus (e.g. gpus: '4-7')",
            )
        for i in arg.stray:
            yield (f"server.extra_args[{i}]", _stray_finding(version, extra_args[i]))


#: SGLang flags that pick GPUs by index (GPU base_gpu_id + i * gpu_id_step is rank i's): the server
#: would run on GPUs other than plan.gpu_set, which every host check looks at.
GPU_FLAGS = frozenset({"--base-gpu-id", "--gpu-id-step"})


def _spelled(opt: sglang_flags.OptionSpec, prefix: str) -> str:
    """The spelling of `opt` that `prefix` abbreviates."""
    return next((n for n in opt.names if n.startswith(prefix)), opt.names[0])


def _argparse_finding(version: str, message: str) -> str:
    """argparse's refusal in the words of a profile field."""
    ambiguous = re.match(r"ambiguous option: (.*?) could match (.*)$", message)
    if ambiguous:
        word, matches = ambiguous.groups()
        candidates = ", ".join(sorted(matches.split(", ")))
        shown = word.split("=", 1)[0]
        return f"{shown} is ambiguous in {sglang_flags.named(version)} ({candidates}); spell it out"
    return f"{sglang_flags.named(version)} would exit at start with: {message}"


def _stray_finding(version: str, word: str) -> str:
    text = (
        f"stray word {_quote(word)}: SGLang {version} takes no positional arguments "
        "(argparse: unrecognized arguments)"
    )
    if word.startswith("-") and " " in word:
        flag, value = word.split(" ", 1)
        return f"{text}; give a flag and its value as two items: {flag!r}, {value!r}"
    return f"{text}; is it a value of the flag before it, which takes fewer?"


def _quote(word: str, limit: int = 40) -> str:
    text = repr(word)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


# --- parallelism and speculative decoding against SGLang's own checks ----------------
# SGLang checks these at start, after the weights' config is read, and dies or silently
# changes the setting. Each rule cites the version and function of server_args.py (0.5.9)
# or of the arg_groups/ module (0.5.23) it follows; the two versions differ in places.


def dp_layout(version: str, dp_size: int, extra: dict[str, Any]) -> tuple[int, int]:
    """(replicas, attention-DP groups) of a server: DP attention splits one TP group's GPUs.

    0.5.9, ServerArgs._handle_data_parallelism: --enable-dp-attention with dp_size 1 is
    switched off; otherwise dp_size groups share the tp_size GPUs (DataParallelController.
    launch_dp_attention_schedulers), where plain DP launches dp_size groups of tp_size GPUs.
    0.5.23, parallel_hook.handle_deprecated_dp_attention: --dp-size N --enable-dp-attention
    becomes --attn-dp-size N with dp_size 1, unless --attn-dp-size is given; dp_size then
    counts replicas only (runtime_context.num_dp_ranks_of: dp_size x attn_dp_size).
    """
    enabled = bool(extra.get("--enable-dp-attention"))
    if "--attn-dp-size" not in sglang_flags.flag_table(version).names:
        return (1, dp_size) if enabled and dp_size > 1 else (dp_size, 1)
    attn = int(extra.get("--attn-dp-size", 1))
    if enabled and attn == 1:
        return 1, dp_size
    return dp_size, attn


def gpus_needed(*, sglang_version: str, tp_size: int, dp_size: int, extra_args: list[str]) -> int:
    """GPUs one server uses over all its nodes: tp x pp per replica, and dp_size replicas unless
    DP attention folds the DP groups into the TP group (see dp_layout)."""
    extra = sglang_flags.option_values(sglang_version, extra_args)
    replicas, _ = dp_layout(sglang_version, dp_size, extra)
    return tp_size * int(extra.get("--pp-size", 1)) * replicas


def check_parallel(
    *, sglang_version: str, tp_size: int, dp_size: int, extra_args: list[str]
) -> Iterator[Finding]:
    """DP attention splits the TP group: SGLang asserts tp_size % groups == 0 (a bare
    AssertionError: 0.5.9 ServerArgs._handle_data_parallelism; 0.5.23
    parallel_hook.handle_data_parallelism), and 0.5.23 refuses replicas with attention DP."""
    extra = sglang_flags.option_values(sglang_version, extra_args)
    replicas, groups = dp_layout(sglang_version, dp_size, extra)
    if groups > 1 and tp_size % groups:
        yield (
            "server.dp_size",
            f"with DP attention SGLang {sglang_version} splits the tp_size {tp_size} GPUs into {groups} "
            f"attention groups and asserts tp_size % {groups} == 0 (it dies on a bare AssertionError); "
            f"use a dp_size (or --attn-dp-size) that divides tp_size",
        )
    if groups > 1 and replicas > 1:
        yield (
            "server.dp_size",
            f"SGLang {sglang_version} refuses --dp-size {replicas} with --attn-dp-size {groups} "
            "(parallel_hook.handle_data_parallelism): use one of them",
        )


#: With eagle_topk > 1 and a page size > 1, the attention backends SGLang accepts, from each
#: release on (sglang_flags.at_or_below). 0.5.9 to 0.5.12: ServerArgs._handle_speculative_decoding;
#: from 0.5.13: speculative_hook._handle_eagle_family (_PAGE_TREE_SPEC_BACKENDS, read in every
#: wheel to 0.5.23); NGRAM, all: flashinfer only (0.5.23 speculative_hook._handle_ngram).
_PAGE_TREE_BACKENDS = {"0.5.9": ("flashinfer", "fa3"), "0.5.13": ("flashinfer", "fa3", "triton")}
_NGRAM_PAGE_TREE_BACKENDS = ("flashinfer",)

#: Backends that force a page size whatever --page-size says: backend -> (sizes kept, size forced).
#: 0.5.9 ServerArgs._handle_attention_backend_compatibility; 0.5.23
#: overrides._mla_backend_page_constraints (trtllm_mha also keeps 128 there).
_FORCED_PAGE = {
    "flashmla": ((64,), 64),
    "cutlass_mla": ((128,), 128),
    "trtllm_mla": ((32, 64), 64),
    "cutedsl_mla": ((32, 64), 64),
    "trtllm_mha": ((16, 32, 64), 64),
    "hpc_ops": ((64,), 64),
}

#: SGLang's default of --speculative-ngram-max-bfs-breadth, which NGRAM uses as its top-k
#: (0.5.9 ServerArgs.speculative_ngram_max_bfs_breadth; 0.5.23 arg_groups/fields/spec.py).
NGRAM_DEFAULT_BFS_BREADTH = 10


def check_speculative_server(
    *,
    sglang_version: str,
    algorithm: str | None,
    eagle_topk: int | None,
    adaptive: bool = False,
    dp_size: int,
    extra_args: list[str],
) -> Iterator[Finding]:
    """Speculative settings against the server's: what SGLang refuses or overwrites at start."""
    if algorithm is None:
        return
    extra = sglang_flags.option_values(sglang_version, extra_args)
    _, groups = dp_layout(sglang_version, dp_size, extra)
    if adaptive:
        yield from _adaptive_server(sglang_version, groups, extra)
    if algorithm in ("STANDALONE", "NGRAM") and groups > 1:
        where = sglang_flags.at_or_below(_SPEC_CHECK, sglang_version)[algorithm]
        yield (
            "speculative.algorithm",
            f"SGLang {sglang_version} refuses {algorithm} with DP attention ({where}: "
            f"'Currently {algorithm.lower()} speculative decoding does not support dp attention'); "
            "drop --enable-dp-attention/--attn-dp-size or use EAGLE/EAGLE3",
        )
    if algorithm == "NGRAM":
        topk = int(extra.get("--speculative-ngram-max-bfs-breadth", NGRAM_DEFAULT_BFS_BREADTH))
        yield from _page_tree(sglang_version, algorithm, topk, extra, _NGRAM_PAGE_TREE_BACKENDS)
    elif eagle_topk is not None:
        yield from _page_tree(
            sglang_version,
            algorithm,
            eagle_topk,
            extra,
            sglang_flags.at_or_below(_PAGE_TREE_BACKENDS, sglang_version),
        )


#: Flags with which SGLang 0.5.23 switches adaptive off (adaptive_spec_params._maybe_disable_adaptive),
#: with its reason.
_ADAPTIVE_OFF_FLAGS = {
    "--enable-multi-layer-eagle": (
        "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    ),
    "--enable-two-batch-overlap": (
        "enable_two_batch_overlap=True is not supported "
        "(adaptive state swap would discard the TboAttnBackend wrapper)"
    ),
    "--enable-pdmux": (
        "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
    ),
}
#: Flags with which SGLang 0.5.23 refuses to start with adaptive (lora_hook.py, hisparse_hook.py).
_ADAPTIVE_REFUSED_FLAGS = {
    "--enable-lora": (
        "LoRA with EAGLE/NEXTN/EAGLE3 speculative decoding does not support --speculative-adaptive: "
        "the draft is built from a static ServerArgs snapshot, and the runtime-state swap does not "
        "rebuild LoRA cuda-graph metadata."
    ),
    "--enable-hisparse": (
        "HiSparse speculative decoding uses statically sized swap state; "
        "--speculative-adaptive is not supported."
    ),
}
_ADAPTIVE_REFUSED_FLAGS["--lora-paths"] = _ADAPTIVE_REFUSED_FLAGS["--enable-lora"]


def _adaptive_server(version: str, groups: int, extra: dict[str, Any]) -> Iterator[Finding]:
    """speculative.adaptive against the SGLang version and the server's flags."""
    if sglang_flags.version_key(version) < sglang_flags.version_key(ADAPTIVE_FROM):
        if "--speculative-adaptive" in sglang_flags.flag_table(version).names:
            yield (
                "speculative.adaptive",
                f"orchestrator writes SGLang {ADAPTIVE_FROM}'s adaptive config (per-batch-size tiers) and "
                f"follows its rules; {sglang_flags.named(version)} was not checked against them: set "
                f"sglang_version {ADAPTIVE_FROM} or later, or drop adaptive",
            )
        else:
            yield (
                "speculative.adaptive",
                f"SGLang {version} has no flag for this (--speculative-adaptive); remove it or set "
                f"sglang_version {ADAPTIVE_FROM} or later",
            )
        return
    if groups > 1:
        reason = (
            "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
        )
        yield (
            "speculative.adaptive",
            f"SGLang would silently run static settings: '{ADAPTIVE_FALLBACK.format(reason)}'; "
            "drop --enable-dp-attention/--attn-dp-size or adaptive",
        )
    for name, reason in _ADAPTIVE_OFF_FLAGS.items():
        if extra.get(name):
            yield (
                "speculative.adaptive",
                f"SGLang would silently run static settings: '{ADAPTIVE_FALLBACK.format(reason)}'; "
                f"drop {name} or adaptive",
            )
    for name, message in _ADAPTIVE_REFUSED_FLAGS.items():
        if extra.get(name):
            yield (
                "speculative.adaptive",
                f"SGLang refuses it at start: '{message}'; drop {name} or adaptive",
            )


#: Where SGLang refuses STANDALONE and NGRAM with DP attention, from each release on: 0.5.13
#: moved the speculative checks out of ServerArgs into arg_groups/speculative_hook.py.
_SPEC_CHECK = {
    "0.5.9": dict.fromkeys(("STANDALONE", "NGRAM"), "ServerArgs._handle_speculative_decoding"),
    "0.5.13": {
        "STANDALONE": "speculative_hook._handle_eagle_family",
        "NGRAM": "speculative_hook._handle_ngram",
    },
}


def _ngram_overwrites(
    num_steps: int | None, eagle_topk: int | None, num_draft_tokens: int | None, draft_model_path: str | None
) -> Iterator[Finding]:
    """NGRAM drafts from n-grams of the context: 0.5.9 ServerArgs._handle_speculative_decoding and
    0.5.23 speculative_hook._handle_ngram set speculative_eagle_topk to
    --speculative-ngram-max-bfs-breadth whatever it was, and neither loads a draft model for it."""
    if eagle_topk is not None:
        yield (
            "speculative.eagle_topk",
            f"SGLang overwrites it for NGRAM with --speculative-ngram-max-bfs-breadth (default "
            f"{NGRAM_DEFAULT_BFS_BREADTH}); leave num_steps, eagle_topk and num_draft_tokens out and set "
            "that flag in server.extra_args",
        )
    elif num_steps is not None or num_draft_tokens is not None:
        # The renderer emits the three together; without eagle_topk it has nothing to emit.
        yield (
            "speculative",
            "for NGRAM leave num_steps and num_draft_tokens out too: they are rendered only with "
            "eagle_topk, which SGLang overwrites; SGLang derives them for NGRAM",
        )
    if draft_model_path is not None:
        yield (
            "speculative.draft_model_path",
            "NGRAM loads no draft model (it drafts from n-grams of the context), so SGLang ignores it; "
            "remove draft_model_path or use EAGLE3",
        )


def _page_tree(
    version: str, algorithm: str, topk: int, extra: dict[str, Any], allowed: tuple[str, ...]
) -> Iterator[Finding]:
    """top-k > 1 with pages > 1 needs a backend that draws the draft tree over pages."""
    if topk <= 1:
        return
    backend = extra.get("--attention-backend")
    prefill, decode = extra.get("--prefill-attention-backend"), extra.get("--decode-attention-backend")
    if prefill is not None and prefill == decode:  # 0.5.9 _handle_attention_backend_compatibility
        backend = prefill
    if algorithm != "NGRAM" and "trtllm_mha" in (backend, prefill, decode):
        yield (
            "speculative.eagle_topk",
            f"SGLang {version} refuses top-k {topk} with the trtllm_mha attention backend "
            "('trtllm_mha backend only supports topk = 1'); use eagle_topk 1 or another backend",
        )
        return
    page, forced_by = _page_size(extra, (backend, decode))
    if page <= 1 or backend in allowed:
        return
    why = f"page size {page}" + (f" (forced by the {forced_by} backend)" if forced_by else " (--page-size)")
    if backend:
        problem = f"it refuses {backend} at start"
    else:
        problem = "with no --attention-backend it picks one by GPU and model, and refuses to start on another"
    topk_name = "--speculative-ngram-max-bfs-breadth" if algorithm == "NGRAM" else "eagle_topk"
    pages = "" if forced_by else ", drop --page-size,"
    yield (
        "speculative.eagle_topk" if algorithm != "NGRAM" else "speculative.algorithm",
        f"{algorithm} with top-k {topk} and {why} needs attention backend {' or '.join(allowed)} in "
        f"SGLang {version}; {problem}; set {topk_name} to 1{pages} or use --attention-backend {allowed[0]}",
    )


def _page_size(extra: dict[str, Any], backends: tuple[Any, ...]) -> tuple[int, str | None]:
    """The page size SGLang ends up with, and the backend that forced it if one did."""
    page = int(extra.get("--page-size") or 1)
    for backend in backends:
        if backend in _FORCED_PAGE:
            kept, forced = _FORCED_PAGE[backend]
            if page not in kept:
                return forced, backend
    return page, None


# --- environment ---------------------------------------------------------------------


def check_nccl(nccl: dict[str, str]) -> Iterator[Finding]:
    for name, value in nccl.items():
        loc = f"nccl.{name}"
        if name not in KNOWN_NCCL:
            close = difflib.get_close_matches(name, KNOWN_NCCL, n=1, cutoff=0.7)
            hint = f"; did you mean {close[0]}?" if close else ""
            yield (loc, f"unknown NCCL variable (NCCL would silently ignore it){hint}")
            continue
        problem = _nccl_value_problem(name, value)
        if problem:
            yield (loc, problem)


#: Known NCCL variables whose value NCCL reads as text (ncclGetEnv and a parser of its own, or a
#: name or path). Every other known variable is an integer NCCL_PARAM, read by ncclLoadParam
#: (param.cc) with strtoll(value, NULL, 0): `0x` is hex, a leading `0` octal, and whatever follows
#: the digits is ignored without a word, so `NCCL_IB_TIMEOUT=1.10` runs as 1.
_NCCL_TEXT = frozenset(
    """
    NCCL_ALGO NCCL_PROTO NCCL_P2P_LEVEL NCCL_NET_GDR_LEVEL NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS
    NCCL_CONF_FILE NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_IB_HCA NCCL_IB_ADDR_FAMILY
    NCCL_IB_ADDR_RANGE NCCL_NET NCCL_NET_PLUGIN NCCL_OOB_NET_IFNAME NCCL_TUNER_PLUGIN
    NCCL_PROFILER_PLUGIN NCCL_ENV_PLUGIN NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_LAUNCH_MODE NCCL_RAS_ADDR
    """.split()  # noqa: SIM905
)
#: What strtoll(value, NULL, 0) reads: leading whitespace, a sign, then 0x-hex, 0-octal or decimal.
_STRTOLL = re.compile(r"[ \t\n\v\f\r]*([-+]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)?")


def _nccl_value_problem(name: str, value: str) -> str | None:
    if name in ("NCCL_PROTO", "NCCL_ALGO"):
        allowed = _PROTOS if name == "NCCL_PROTO" else _ALGOS
        items = value.removeprefix("^").split(",")
        pretty = (
            "LL, LL128, Simple"
            if name == "NCCL_PROTO"
            else "Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT"
        )
        if any(item != item.strip() for item in items):
            # strtok_r(",") and strcasecmp: " LL128" is no protocol (older NCCL skips it silently).
            fixed = ",".join(item.strip() for item in items)
            return f"{value!r} has spaces around a name, which NCCL does not trim: write {fixed!r}"
        bad = [v for v in items if v.upper() not in allowed]
        if bad:
            return f"invalid value {', '.join(bad)!s}: use a comma list of {pretty} (a leading ^ excludes)"
    elif name == "NCCL_P2P_LEVEL":
        if value.upper() not in _P2P_LEVELS and not _is_decimal(value):
            return f"invalid value {value!r}: use one of LOC, NVL, PIX, PXB, PHB, SYS or an integer"
    elif name == "NCCL_NTHREADS" and value not in _NTHREADS:
        return f"invalid value {value!r}: use one of 64, 128, 256, 512"
    elif name == "NCCL_DEBUG" and value.upper() not in _DEBUG:
        return f"invalid value {value!r}: use one of VERSION, WARN, INFO, TRACE"
    elif name not in _NCCL_TEXT:
        return _nccl_integer_problem(name, value)
    return None


def _nccl_integer_problem(name: str, value: str) -> str | None:
    """An integer NCCL_PARAM as strtoll(base 0) reads it: only a form that reads whole and means
    the same to a person passes (decimal, or 0x hex)."""
    match = _STRTOLL.match(value)
    assert match is not None  # every part may be empty: it matches any text
    sign, digits = match.group(1), match.group(2) or ""
    if digits.startswith(("0x", "0X")):
        read = int(sign + digits[2:], 16)
    elif digits.startswith("0"):
        read = int(sign + digits, 8)
    else:
        read = int(sign + digits) if digits else 0
    whole = match.end() == len(value) and digits and not value[:1].isspace()
    if whole and len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX":
        return (
            f"{value!r} is octal to NCCL (it reads {name} with strtoll, base 0): it would run as {read}; "
            f"write {read}, or {int(value)} without the leading zero if decimal was meant"
        )
    if not value:
        return "is empty: NCCL ignores it and keeps its default; drop it or give an integer"
    if not whole:
        return (
            f"{value!r} is not an integer: NCCL reads {name} with strtoll and would run with {read}; "
            "write an integer"
        )
    if name in _POSITIVE_INT and not 0 < read <= _INT64_MAX:
        return f"invalid value {value!r}: must be a positive integer of at most {_INT64_MAX}"
    if not -_INT64_MAX - 1 <= read <= _INT64_MAX:
        return f"invalid value {value!r}: NCCL reads {name} into a 64-bit integer"
    return None


def _is_decimal(value: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '١٢٣' and '²', which NCCL's strtol does not."""
    return value.isascii() and value.isdigit()


def check_env(env: dict[str, str]) -> Iterator[Finding]:
    for name in env:
        if name.startswith("NCCL_"):
            yield (f"env.{name}", "NCCL variables belong under nccl:, where they are checked")
        elif name == "CUDA_VISIBLE_DEVICES":
            yield (
                f"env.{name}",
                "set the GPUs with server.gpus (e.g. gpus: [4, 5, 6, 7] or '4-7'): it renders "
                "CUDA_VISIBLE_DEVICES, and preflight, the GPU idle check, --kill-gpu-holders, status "
                "and verify look at those GPUs only",
            )
        elif looks_secret(name):
            yield (
                f"env.{name}",
                "looks like a secret, and env: is written into the unit file, which every user on the "
                f"host can read: move it to secret_env: {{{name}: {{env: {name}}}}} (or {{file: PATH}}), "
                "read on this machine and written 0600 for the service user",
            )


#: Parts of a variable name that mark its value as a secret (HF_TOKEN, WANDB_API_KEY, ...).
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def check_secret_env(names: list[str], env: dict[str, str], nccl: dict[str, str]) -> Iterator[Finding]:
    """secret_env names: not also set in plain env/nccl, and not CUDA_VISIBLE_DEVICES."""
    for name in names:
        if name in env or name in nccl:
            where = "env" if name in env else "nccl"
            yield (f"secret_env.{name}", f"also set under {where}:; keep it in one place")
        elif name == "CUDA_VISIBLE_DEVICES":
            yield (f"secret_env.{name}", "set the GPUs with server.gpus")
        elif name.startswith("NCCL_"):
            yield (f"secret_env.{name}", "no secret: set NCCL variables under nccl:, where they are checked")
        elif name in PLAN_ENV:
            yield (f"secret_env.{name}", f"{name} is set by the unit ({PLAN_ENV[name]}); set it under env:")


#: Variables the unit sets itself, which an EnvironmentFile= line would override unseen.
PLAN_ENV = {"PYTHONUNBUFFERED": "1, so crash logs reach the journal"}


def check_disaggregation(
    *,
    sglang_version: str,
    mode: str,
    transfer_backend: str,
    bootstrap_port: int,
    port: int,
    cuda_graph: bool,
    extra_args: list[str],
    ib_device: str | None = None,
    bind: str = "0.0.0.0",
) -> Iterator[Finding]:
    """A prefill or decode server's settings as SGLang takes them (server_args.py,
    _handle_pd_disaggregation)."""
    if ib_device is not None and transfer_backend not in ("mooncake", "nixl", "mori"):
        yield (
            "disaggregation.ib_device",
            f"transfer backend {transfer_backend} reads no IB device (mooncake, nixl and mori do): drop it",
        )
    elif (
        ib_device is not None
        and ib_device.lstrip().startswith("{")
        and sglang_flags.help_version(sglang_version) == "0.5.9"
    ):
        yield (
            "disaggregation.ib_device",
            "SGLang 0.5.9 takes a device or a comma list (mlx5_0,mlx5_1), not a per-GPU JSON mapping",
        )
    opt = sglang_flags.flag_table(sglang_version).option("--disaggregation-transfer-backend")
    choices = opt.choices if opt is not None else ()
    if choices and transfer_backend not in choices:
        yield (
            "disaggregation.transfer_backend",
            f"{sglang_flags.named(sglang_version)} has no transfer backend {transfer_backend} "
            f"(it has {', '.join(choices)}); choose one of those or change sglang_version",
        )
    extra = sglang_flags.option_values(sglang_version, extra_args)
    if mode == "decode":
        for flag in ("--disaggregation-decode-tp", "--disaggregation-decode-dp"):
            if flag in extra:
                yield (
                    "server.extra_args",
                    f"{flag} is a prefill server's setting: SGLang refuses it on a decode server "
                    "(it takes its own TP and DP); drop it",
                )
        return
    if bootstrap_port == port:
        yield (
            "disaggregation.bootstrap_port",
            f"{bootstrap_port} is the server's own port (server.port): the bootstrap server needs a "
            "port of its own",
        )
    if bind in ("127.0.0.1", "::1", "localhost"):
        yield (
            "server.host",
            f"{bind} binds the bootstrap server to loopback: decode servers on other hosts cannot reach "
            "it; set host: 0.0.0.0 or this host's address",
        )
    if transfer_backend == "fake":
        yield (
            "disaggregation.transfer_backend",
            "fake moves no KV cache and has no bootstrap server: SGLang refuses it on a prefill server "
            "(it serves a decode server benchmarked alone); choose mooncake, nixl or another backend",
        )
    # 0.5.9's rule (server_args._handle_pd_disaggregation). From 0.5.15 on piecewise graphs are
    # the default and a prefill server keeps its prefill-phase graphs.
    piecewise = sglang_flags.flag_table(sglang_version).option("--enable-piecewise-cuda-graph")
    if cuda_graph and piecewise is not None and not extra.get("--enable-piecewise-cuda-graph"):
        yield (
            "server.cuda_graph",
            "SGLang turns CUDA graphs off on a prefill server (unless --enable-piecewise-cuda-graph): "
            "set cuda_graph: false, so the profile says what runs",
        )


def multinode_port_problem(port: int, dist_init_port: int) -> str | None:
    """Rank 0 of a multi-node server binds both: SGLang's HTTP port and torch's rendezvous."""
    if port != dist_init_port:
        return None
    return (
        f"server.port {port} is also deployment.dist_init_port: node rank 0 would bind it twice (HTTP and "
        "--dist-init-addr), and the server would not start; change one of them"
    )


def check_gpu_set(gpus: list[int] | None, gpus_needed: int, kind: str) -> Iterator[Finding]:
    """server.gpus lists the GPUs of one host: all TP x DP of a replica, or one node's share
    of a multi-node server."""
    if gpus is None:
        return
    if kind == "multinode":
        if gpus_needed % len(gpus):
            yield (
                "server.gpus",
                f"lists {len(gpus)} GPUs per node, which does not divide the {gpus_needed} GPUs TP x DP "
                "needs over all nodes",
            )
    elif len(gpus) != gpus_needed:
        yield (
            "server.gpus",
            f"lists {len(gpus)} GPUs, but TP x DP needs {gpus_needed} (tp_size x dp_size, or tp_size "
            f"alone with DP attention): list {gpus_needed} GPUs or change tp_size/dp_size",
        )
