"""Rules that span several fields of a profile, each naming the field and the fix.

SGLang does not check these itself, or checks them badly:
- the speculative trio (num_steps, eagle_topk, num_draft_tokens) is all or none; with
  only some SGLang dies on a bare AssertionError;
- with eagle_topk 1 it silently replaces num_draft_tokens by num_steps + 1, and
  num_draft_tokens > num_steps * eagle_topk + 1 is not a meaningful draft tree;
- EAGLE3 needs a draft model path (so do EAGLE, its alias NEXTN, and STANDALONE);
- flags drift between versions: 0.5.23 has no --cuda-graph-max-bs, and argparse calls
  that spelling ambiguous; a flag argparse rejects is exit 2 after start;
- NCCL ignores NCCL_* names it does not know, so a typo silently does nothing.

The rules take plain values, not the profile's models, so that this module depends on
nothing of the profile: `profile` calls them, never the other way round.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from orchestrator import sglang_flags

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
) -> Iterator[Finding]:
    """The `speculative` section's fields, by name."""
    trio = {"num_steps": num_steps, "eagle_topk": eagle_topk, "num_draft_tokens": num_draft_tokens}
    given = [k for k, v in trio.items() if v is not None]
    if given and len(given) < 3:
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
    if len(given) < 3:
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


# --- server --------------------------------------------------------------------------

#: Flags that must not come through extra_args: they are modelled, or must never be inline.
_FORBIDDEN_EXTRA = {"--api-key": "never put the key inline; use api_key: {file: PATH} or {env: NAME}"}


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


def check_extra_args(version: str, extra_args: list[str]) -> Iterator[Finding]:
    """Extra args must be flags of that version, unambiguous, and not a modelled setting."""
    table = sglang_flags.flag_table(version)
    modelled = sglang_flags.modelled_flag_names(version)
    for i, arg in enumerate(extra_args):
        if not arg.startswith("-"):
            continue
        name = arg.split("=", 1)[0]
        loc = f"server.extra_args[{i}]"
        if name in _FORBIDDEN_EXTRA:
            yield (loc, f"{name}: {_FORBIDDEN_EXTRA[name]}")
            continue
        matches = [n for n in table.names if n == name] or [n for n in table.names if n.startswith(name)]
        if not matches:
            close = difflib.get_close_matches(name, table.names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            yield (loc, f"{name} is not a flag of SGLang {version}{hint}")
        elif len(matches) > 1 and name not in matches:
            yield (
                loc,
                f"{name} is ambiguous in SGLang {version} ({', '.join(sorted(matches))}); spell it out",
            )
        elif matches[0] in modelled:
            yield (loc, f"{name} duplicates a modelled setting; set it in the profile's fields instead")


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


def _nccl_value_problem(name: str, value: str) -> str | None:
    if name in ("NCCL_PROTO", "NCCL_ALGO"):
        allowed = _PROTOS if name == "NCCL_PROTO" else _ALGOS
        items = value.removeprefix("^").split(",")
        bad = [v for v in items if v.strip().upper() not in allowed]
        if bad:
            pretty = (
                "LL, LL128, Simple"
                if name == "NCCL_PROTO"
                else "Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT"
            )
            return f"invalid value {', '.join(bad)!s}: use a comma list of {pretty} (a leading ^ excludes)"
    elif name == "NCCL_P2P_LEVEL":
        if value.upper() not in _P2P_LEVELS and not _is_decimal(value):
            return f"invalid value {value!r}: use one of LOC, NVL, PIX, PXB, PHB, SYS or an integer"
    elif name == "NCCL_NTHREADS" and value not in _NTHREADS:
        return f"invalid value {value!r}: use one of 64, 128, 256, 512"
    elif name == "NCCL_DEBUG" and value.upper() not in _DEBUG:
        return f"invalid value {value!r}: use one of VERSION, WARN, INFO, TRACE"
    elif name in _POSITIVE_INT and not (_is_decimal(value) and 0 < int(value) <= _INT64_MAX):
        return f"invalid value {value!r}: must be a positive integer of at most {_INT64_MAX}"
    return None


def _is_decimal(value: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '١٢٣' and '²', which NCCL's strtol does not."""
    return value.isascii() and value.isdigit()


def check_env(env: dict[str, str]) -> Iterator[Finding]:
    for name in env:
        if name.startswith("NCCL_"):
            yield (f"env.{name}", "NCCL variables belong under nccl:, where they are checked")
        elif not name.replace("_", "a").isalnum() or name[0].isdigit():
            yield (f"env.{name}", "not a valid environment variable name")
