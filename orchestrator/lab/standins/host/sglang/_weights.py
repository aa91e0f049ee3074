"""A model dir's safetensors files, as SGLang's loader sees them: headers only, standard library.

What each tensor costs one TP rank follows SGLang's layers (python/sglang/srt, both shipped
versions): TP-sharded linears and vocab embeddings take 1/tp of a tensor, replicated parts the
whole one. The replicated ones, by name:

- norms (`nn.LayerNorm`, `RMSNorm`), the MoE router (`MoEGate.weight`, `e_score_correction_bias`:
  plain `nn.Parameter`s in models/deepseek_v2.py);
- MLA's `q_a_proj` and `kv_a_proj_with_mqa` (`fused_qkv_a_proj_with_mqa = ReplicatedLinear(`,
  `self.kv_a_proj_with_mqa = ReplicatedLinear(` in DeepseekV2AttentionMLA.__init__);
- the vision tower except its attention (models/kimi_k25.py: `MLP2` is `nn.Linear`, norms and
  patch embedding whole; `VisionAttention(use_qkv_parallel=True)` shards `wqkv`/`wo`), and the
  projector (`K2VLMultiModalProjector`: `ReplicatedLinear`);
- an EAGLE drafter's `fc` (`self.fc = torch.nn.Linear(` in llama_eagle3.py / llama_eagle.py),
  `d2t`/`t2d`, and compressed-tensors' `weight_shape`.

Routed experts take 1/tp per rank with or without --ep-size (EP holds num_experts/ep experts,
each split over tp/ep). GQA k/v projections keep at least one KV head per rank
(`QKVParallelLinear`: `max(1, num_kv_heads // tp)`).

Every rank reads every tensor of every shard (model_loader/weight_utils.py,
`safetensors_weights_iterator` and 0.5.23's `buffered_multi_thread_safetensors_weights_iterator`:
`f.get_tensor(name)`), then keeps its slice: so the load reads the whole files, and afterwards
they are in the page cache.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
DTYPE_BYTES |= {"BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
#: MiB/s of a read the page cache serves (a copy from memory, several ranks at once).
CACHED_MIB_S = 20000.0

_WHOLE = re.compile(
    r"norm\d*\.(weight|bias)$"  # input_layernorm, q_a_layernorm, model.norm, hidden_norm, norm0
    r"|\.mlp\.gate\.(weight|e_score_correction_bias)$"  # MoEGate
    r"|\.(q_a_proj|kv_a_proj_with_mqa)\."  # MLA's replicated down projections
    r"|(^|\.)fc\.(weight|bias)$|(^|\.)(d2t|t2d)$"  # EAGLE's fc; EAGLE-3's vocab maps
    r"|\.weight_shape$"  # compressed-tensors
    r"|^mm_projector\."
)
_VISION_SHARDED = re.compile(r"\.(wqkv|wo)\.(weight|bias)$")
_KV_PROJ = re.compile(r"self_attn\.(k|v)_proj\.(weight|bias)$")
_LAYER = re.compile(r"layers\.(\d+)\.")


class Tensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def shard_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files, as DefaultModelLoader picks them: `*.safetensors`,
    only those the index names when there is one (filter_duplicate_safetensors_files)."""
    files = sorted(model_dir.glob("*.safetensors"))
    index = model_dir / "model.safetensors.index.json"
    if files and index.is_file():
        named = set(json.loads(index.read_text()).get("weight_map", {}).values())
        files = [f for f in files if f.name in named]
    return files


def read_header(path: Path) -> list[Tensor]:
    """A safetensors file's tensors: an 8-byte little-endian length, then that much JSON."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return [
        Tensor(name, info["dtype"], tuple(info["shape"]), info["data_offsets"][1] - info["data_offsets"][0])
        for name, info in header.items()
    ]


def layer_of(name: str) -> int | None:
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def text_config(config: dict) -> dict:
    return config.get("text_config") or config


def rank_bytes(t: Tensor, tp: int, config: dict) -> int:
    """What one of `tp` ranks holds of tensor `t` (see the module's docstring)."""
    if t.name.startswith("vision_tower."):
        return t.nbytes // tp if _VISION_SHARDED.search(t.name) else t.nbytes
    if _WHOLE.search(t.name):
        return t.nbytes
    if _KV_PROJ.search(t.name):
        text = text_config(config)
        kv_heads = int(text.get("num_key_value_heads") or text.get("num_attention_heads") or 1)
        return t.nbytes // kv_heads * max(1, kv_heads // tp)
    return t.nbytes // tp


def allocation_group(name: str) -> str:
    """The parameter SGLang allocates a checkpoint tensor into: experts' gate and up of one layer are
    one `w13_*` tensor, down one `w2_*` (FusedMoE); q/k/v one `qkv_proj`, gate/up one `gate_up_proj`,
    MLA's q_a/kv_a one `fused_qkv_a_proj_with_mqa`."""
    name = re.sub(r"self_attn\.[qkv]_proj\.", "self_attn.qkv_proj.", name)
    name = re.sub(r"\.(gate|up)_proj\.", ".gate_up_proj.", name)
    return re.sub(r"\.(q_a_proj|kv_a_proj_with_mqa)\.", ".fused_qkv_a_proj_with_mqa.", name)


def _order(name: str) -> tuple[int, int]:
    """Model construction order: a multimodal wrapper builds its vision tower first
    (KimiK25ForConditionalGeneration.__init__), then the embedding, the layers, the norm, the head."""
    if name.startswith(("vision_tower.", "mm_projector.")):
        return 0, 0
    layer = layer_of(name)
    if layer is None:
        layer = -1 if "embed_tokens" in name else 1 << 30
    return 1, layer


@dataclass
class Weights:
    """One rank's share of a checkpoint, in the order SGLang allocates it."""

    files: list[Path]
    groups: list[tuple[str, int]]
    """(parameter, bytes on one rank), allocation order."""

    @property
    def total(self) -> int:
        return sum(b for _, b in self.groups)


def rank_share(tensors: list[Tensor], tp: int, config: dict) -> list[tuple[str, int]]:
    """(parameter, bytes on one of `tp` ranks), in allocation order. Routed experts (nearly all of a
    MoE checkpoint's tensors) take a fast path: 1/tp each, `weight_shape` whole."""
    groups: dict[str, int] = {}
    for t in tensors:
        at = t.name.find(".experts.")
        if at >= 0 and ".shared_experts." not in t.name:
            parts = t.name[at + 9 :].split(".")  # expert, projection, what
            key = t.name[:at] + (".experts.w2_" if parts[1] == "down_proj" else ".experts.w13_") + parts[-1]
            size = t.nbytes if parts[-1] == "weight_shape" else t.nbytes // tp
        else:
            key, size = allocation_group(t.name), rank_bytes(t, tp, config)
        groups[key] = groups.get(key, 0) + size
    return sorted(groups.items(), key=lambda g: _order(g[0]))


#: Where a computed share is kept for the next start of the same files: reading Kimi's 61 headers
#: takes a second, which a real start hides in minutes of loading and the lab's tests would not.
CACHE_DIR = Path(os.environ.get("SGLANG_STANDIN_CACHE_DIR", "/var/tmp/sglang-standin-weights"))


def load(model_dir: Path, tp: int, config: dict, part: str = "all") -> Weights:
    """A model dir's weights on one of `tp` ranks. `part`: "all"; "target" leaves out the MTP layers
    (a DeepSeek target skips layers past num_hidden_layers); "mtp" keeps only them (a NEXTN draft
    loaded from the target's own dir). Kept in CACHE_DIR while the files are unchanged."""
    files = shard_files(model_dir)
    stats = []
    try:
        for f in files:
            st = f.stat()
            stats.append([str(f), st.st_size, st.st_mtime_ns, st.st_ino])
    except OSError:
        return _load(files, tp, config, part)  # the load itself says what is wrong
    key = json.dumps([str(model_dir), tp, part, stats, config], sort_keys=True)
    cache = CACHE_DIR / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    try:
        kept = json.loads(cache.read_text())
        if kept.get("key") == key:
            return Weights(files, [(name, int(size)) for name, size in kept["groups"]])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    weights = _load(files, tp, config, part)
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "groups": weights.groups}))
        tmp.replace(cache)
    except OSError:
        pass
    return weights


def _load(files: list[Path], tp: int, config: dict, part: str) -> Weights:
    """load() without its cache."""
    tensors = [t for f in files for t in read_header(f)]
    text = text_config(config)
    if part == "mtp" or (part == "target" and int(text.get("num_nextn_predict_layers") or 0) > 0):
        layers = int(text.get("num_hidden_layers") or 0)
        tensors = [t for t in tensors if ((layer_of(t.name) or 0) >= layers) == (part == "mtp")]
    return Weights(files, rank_share(tensors, tp, config))


# --- the page cache ---------------------------------------------------------------------------

_PAGE = mmap.PAGESIZE


class _CacheStat(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint64) for f in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


class _CacheRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


#: cachestat(2) (Linux 6.5): the same number on x86_64 and the generic table (aarch64).
_SYS_CACHESTAT = 451
_MINCORE_CHUNK = 1 << 30


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        return libc
    except (OSError, AttributeError):
        return None


def _cachestat(libc: ctypes.CDLL, fd: int) -> int | None:
    """Pages of the file in the page cache by cachestat(2), or None where the kernel lacks it."""
    stat, whole = _CacheStat(), _CacheRange(0, 0)
    if libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(whole), ctypes.byref(stat), 0) != 0:
        return None
    return int(stat.cache)


def _mincore(libc: ctypes.CDLL, fd: int, size: int) -> int | None:
    """Pages of the file in the page cache by mincore(2) over read-only mappings of 1 GiB at a time."""
    pages = 0
    for offset in range(0, size, _MINCORE_CHUNK):
        length = min(_MINCORE_CHUNK, size - offset)
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = ctypes.create_string_buffer((length + _PAGE - 1) // _PAGE)
            if libc.mincore(addr, length, vec) != 0:
                return None
            pages += len(vec.raw) - vec.raw.count(0)
        finally:
            libc.munmap(addr, length)
    return pages


def resident_bytes(path: Path, method: str = "auto") -> int:
    """Bytes of `path` in the page cache: cachestat(2) where the kernel has it (a call per file),
    else mincore(2) (a byte per page); 0 (all cold) when neither answers. `method`: auto,
    cachestat or mincore."""
    size = path.stat().st_size
    libc = _libc()
    if libc is None or size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = _cachestat(libc, fd) if method in ("auto", "cachestat") else None
        if pages is None and method in ("auto", "mincore"):
            pages = _mincore(libc, fd, size)
    except (OSError, AttributeError):
        pages = None
    finally:
        os.close(fd)
    return min(size, (pages or 0) * _PAGE)


def read_seconds(files: list[Path], read_mib_s: float) -> tuple[float, int, int]:
    """(seconds, cold bytes, cached bytes) of reading `files` whole: what the page cache lacks at the
    storage's `read_mib_s`, what it holds at CACHED_MIB_S."""
    total = sum(f.stat().st_size for f in files)
    cached = sum(resident_bytes(f) for f in files)
    cold = total - cached
    return cold / (1 << 20) / read_mib_s + cached / (1 << 20) / CACHED_MIB_S, cold, cached


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def fill_page_cache(files: list[Path]) -> threading.Thread | None:
    """Read `files` into the page cache in the background, as the real load leaves them there.

    sendfile(2) to /dev/null reads through the cache without copying to this process (on ext4 a
    sparse file's holes are cached as zero pages; tmpfs keeps no pages for holes). Skipped when the
    files exceed half of MemAvailable: the kernel would evict them as it read them.
    """
    total = sum(f.stat().st_size for f in files)
    if not files or total > mem_available() // 2:
        return None

    def run() -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            for path in files:
                fd = os.open(path, os.O_RDONLY)
                try:
                    offset, size = 0, path.stat().st_size
                    while offset < size:
                        sent = os.sendfile(null, fd, offset, 1 << 26)
                        if sent <= 0:
                            break
                        offset += sent
                finally:
                    os.close(fd)
        except OSError:
            pass
        finally:
            os.close(null)

    thread = threading.Thread(target=run, name="page-cache", daemon=True)
    thread.start()
    return thread
