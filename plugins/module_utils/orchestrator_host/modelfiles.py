"""A model directory's files, read fast and safely: each safetensors tensor's dtype, shape and size
(from the headers, never the data), a fingerprint to compare the directory across hosts, and how
much of it is in the page cache, with a bounded read-ahead.

Everything here only reads. A bad file gives one line naming it and what is wrong; nothing raises.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import mmap
import os
import posixpath
import re
import stat
import struct
import time
from collections.abc import Container, Iterator
from typing import Any

#: Bits per element of each safetensors dtype: the format's own list (huggingface/safetensors,
#: `Dtype::bitsize`). The format has no aliases such as F8_E4M3FN: its loader refuses them too.
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
#: The largest header read_header accepts by default. The reference loader refuses 100 MB.
MAX_HEADER_BYTES = 100 * 2**20
#: Files up to this size are hashed whole. Bigger ones are sampled.
FULL_HASH_BYTES = 2**20
#: The index that maps each tensor to its shard (transformers' name for it).
INDEX = "model.safetensors.index.json"
#: The start of scan's error for a directory without safetensors files: SGLang loads other
#: formats, so a caller may take it as a note rather than a problem.
NO_SAFETENSORS = "no *.safetensors files in"
#: The biggest index or config.json read whole. A real one is a few MiB.
MAX_JSON_BYTES = 256 * 2**20
#: The name components whose next component is a layer number (Llama, GPT-2, ViT styles).
LAYER_PARENTS = frozenset(("layers", "h", "blocks"))
#: mincore is asked about this much of a file at a time, so a 600 GB shard maps in pieces.
WINDOW_BYTES = 2**30
#: read_ahead's one buffer.
CHUNK_BYTES = 8 * 2**20

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
#: mincore sets bit 0 of each page's byte; the others are reserved.
_LOW_BIT = bytes(b & 1 for b in range(256))


class _Problem(Exception):
    """One line for the user: what is wrong, naming the file."""


def size_text(n: int, digits: int = 1) -> str:
    """`4.2 GiB`, `512 bytes`: a size as a person reads it."""
    if n < 1024:
        return "1 byte" if n == 1 else f"{n} bytes"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.{digits}f} {unit}"


def _os_error(path: str, exc: OSError) -> str:
    """An OSError on `path` as one line."""
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"{path} is a broken symlink to {os.readlink(path)}"
    if exc.errno == errno.ENOENT:
        return f"{path} does not exist"
    if exc.errno == errno.ELOOP:
        return f"{path} is a symlink loop"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path} is unreadable: permission denied"
    return f"{path} is unreadable: {exc.strerror or exc}"


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    """`n` bytes at `offset`, or fewer where the file ends."""
    parts = []
    while n > 0:
        got = os.pread(fd, n, offset)
        if not got:
            break
        parts.append(got)
        n -= len(got)
        offset += len(got)
    return b"".join(parts)


def _open(path: str) -> tuple[int, os.stat_result]:
    """A read-only fd on the regular file `path` (symlinks followed), and its stat."""
    try:
        # O_NONBLOCK: a FIFO put where a file was cannot hang the open. A regular file ignores it.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise _Problem(_os_error(path, exc)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _Problem(f"{path} is not a regular file")
    return fd, st


# --- safetensors headers -------------------------------------------------------------------------


def read_header(path: str, max_header_bytes: int = MAX_HEADER_BYTES) -> tuple[dict, int, str]:
    """The tensors of the safetensors file `path`, from its header alone.

    Returns ({name: (dtype, shape, nbytes)}, header length, error). The error is "" when the
    header is sound. Otherwise it is one line naming the file, and the tensors are {}.
    Only the 8-byte length and the header are read, never the tensor data."""
    try:
        fd, st = _open(path)
    except _Problem as problem:
        return {}, 0, str(problem)
    try:
        tensors, length, _sha = _header(fd, st.st_size, path, max_header_bytes)
        return tensors, length, ""
    except _Problem as problem:
        return {}, 0, str(problem)
    except OSError as exc:
        return {}, 0, _os_error(path, exc)
    finally:
        os.close(fd)


def _header(fd: int, size: int, path: str, max_header_bytes: int) -> tuple[dict, int, str]:
    """(tensors, header length, sha256 of the header bytes) of the open file; _Problem when bad."""
    if size < 8:
        raise _Problem(f"{path}: {size} bytes, too short for a safetensors file (8-byte length first)")
    (length,) = struct.unpack("<Q", _pread_all(fd, 8, 0))
    if 8 + length > size:
        raise _Problem(
            f"{path}: the header claims {size_text(length)}, the file has {size_text(size)}: "
            "it is cut short, or not a safetensors file"
        )
    if length > max_header_bytes:
        raise _Problem(
            f"{path}: the header claims {size_text(length)}, "
            f"more than the {size_text(max_header_bytes)} a header may have"
        )
    raw = _pread_all(fd, length, 8)
    if len(raw) < length:
        raise _Problem(f"{path}: the header is cut short: {len(raw)} of its {length} bytes could be read")
    tensors = _parse_header(raw, size - 8 - length, path)
    return tensors, length, hashlib.sha256(raw).hexdigest()


def _parse_header(raw: bytes, data_size: int, path: str) -> dict:
    """{name: (dtype, shape, nbytes)} from the header's bytes; _Problem when any entry is bad."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Problem(
            f"{path}: the header is not UTF-8 (byte {exc.start}): not a safetensors file"
        ) from None
    try:
        header = json.loads(text)
    except RecursionError:
        raise _Problem(f"{path}: the header's JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise _Problem(f"{path}: the header is not valid JSON ({reason}{where})") from None
    if not isinstance(header, dict):
        raise _Problem(f"{path}: the header is a JSON {_json_type(header)}, not an object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _Problem(f"{path}: __metadata__ must map names to strings")
    tensors = {}
    spans = []
    for name, entry in header.items():
        dtype, shape, nbytes, begin, end = _tensor(name, entry, path)
        if end > data_size:
            raise _Problem(
                f"{path}: tensor {_q(name)} ends {size_text(end)} into the data, but the file holds "
                f"{size_text(data_size)} of data: it is cut short"
            )
        tensors[name] = (dtype, shape, nbytes)
        spans.append((begin, end, name))
    _check_spans(spans, data_size, path)
    return tensors


def _tensor(name: str, entry: Any, path: str) -> tuple[str, tuple, int, int, int]:
    """One header entry as (dtype, shape, nbytes, begin, end); _Problem when it is bad."""
    where = f"{path}: tensor {_q(name)}"
    if not isinstance(entry, dict):
        raise _Problem(f"{where} is a JSON {_json_type(entry)}, not an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        raise _Problem(f"{where} has no {' or '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str):
        raise _Problem(f"{where}: dtype is a JSON {_json_type(dtype)}, not a string")
    if dtype not in DTYPE_BITS:
        raise _Problem(f"{where} has unknown dtype {_q(dtype)} (safetensors has {', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list):
        raise _Problem(f"{where}: shape is a JSON {_json_type(shape)}, not a list")
    for dim in shape:
        if not _is_int(dim):
            raise _Problem(f"{where}: shape {_short(shape)} has a size that is not a whole number")
        if dim < 0:
            raise _Problem(f"{where}: shape {_short(shape)} has a negative size")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise _Problem(f"{where}: data_offsets must be [begin, end], two whole numbers")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise _Problem(f"{where}: data_offsets {offsets} must have 0 <= begin <= end")
    elements = 1
    for dim in shape:
        elements *= dim
    bits = elements * DTYPE_BITS[dtype]
    if bits % 8:
        raise _Problem(f"{where}: {dtype} {_short(shape)} is {bits} bits, not a whole number of bytes")
    if end - begin != bits // 8:
        raise _Problem(f"{where} holds {end - begin} bytes, but {dtype} {_short(shape)} needs {bits // 8}")
    return dtype, tuple(shape), bits // 8, begin, end


def _check_spans(spans: list[tuple[int, int, str]], data_size: int, path: str) -> None:
    """The tensors tile the data with no gap or overlap, as the safetensors loader demands."""
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            how = "overlaps the tensor before it" if begin < at else f"leaves a gap of {begin - at} bytes"
            raise _Problem(f"{path}: tensor {_q(name)} starts at byte {begin} of the data and {how}")
        at = end
    if at != data_size:
        raise _Problem(
            f"{path}: the file has {size_text(data_size - at)} after the last tensor "
            "(safetensors loaders refuse a file its tensors do not fill)"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _q(text: str, limit: int = 120) -> str:
    """A name from a file, quoted on one line (a newline in it cannot break the line)."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else quoted[: limit - 4] + "...'"


def _short(value: list) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:76] + "...]"


# --- one directory -------------------------------------------------------------------------------


def sample_offsets(size: int, samples: int, sample_bytes: int) -> list[int]:
    """Where the sampled digest reads: `samples` offsets spread evenly, the first and last
    `sample_bytes` of the file included."""
    if size <= sample_bytes or samples <= 1:
        return [0]
    span = size - sample_bytes
    return sorted({i * span // (samples - 1) for i in range(samples)})


def _content_sha256(fd: int, size: int, samples: int, sample_bytes: int, deadline: float, path: str) -> str:
    """The full sha256 of a small file. A big one's is over its size, then the samples."""
    digest = hashlib.sha256()
    if size <= FULL_HASH_BYTES:
        data = _pread_all(fd, size, 0)
        if len(data) != size:
            raise _Problem(f"{path} shrank while it was read")
        digest.update(data)
        return digest.hexdigest()
    digest.update(f"sampled {size} {samples} {sample_bytes}\n".encode())
    for offset in sample_offsets(size, samples, sample_bytes):
        _check_deadline(deadline, path)
        data = _pread_all(fd, min(sample_bytes, size - offset), offset)
        if len(data) != min(sample_bytes, size - offset):
            raise _Problem(f"{path} shrank while it was read")
        digest.update(data)
    return digest.hexdigest()


def _full_sha256(fd: int, deadline: float, path: str) -> str:
    digest = hashlib.sha256()
    offset = 0
    while True:
        _check_deadline(deadline, path)
        data = os.pread(fd, FULL_HASH_BYTES, offset)
        if not data:
            return digest.hexdigest()
        digest.update(data)
        offset += len(data)


class _Deadline(_Problem):
    """The scan ran out of time at the file it names."""


def _check_deadline(deadline: float, path: str) -> None:
    if time.monotonic() >= deadline:
        raise _Deadline(path)


def _walk(top: str, deadline: float) -> list[tuple[str, str]]:
    """(relative name, path) of every regular file under `top`, sorted. Symlinks are followed;
    hidden entries are skipped: huggingface_hub's .cache/ holds per-host download times, and a
    .git/ differs per clone, while neither is part of the model."""
    found = []
    seen = set()
    stack = [("", top)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        _check_deadline(deadline, abs_dir)
        st = os.stat(abs_dir)
        if (st.st_dev, st.st_ino) in seen:
            raise _Problem(f"{abs_dir} leads back to a directory already read (a symlink loop?)")
        seen.add((st.st_dev, st.st_ino))
        try:
            with os.scandir(abs_dir) as entries:
                names = sorted(e.name for e in entries if not e.name.startswith("."))
        except OSError as exc:
            raise _Problem(_os_error(abs_dir, exc)) from None
        for name in names:
            path = os.path.join(abs_dir, name)
            try:
                st = os.stat(path)
            except OSError as exc:
                raise _Problem(_os_error(path, exc)) from None
            if stat.S_ISDIR(st.st_mode):
                stack.append((f"{rel_dir}{name}/", path))
            elif stat.S_ISREG(st.st_mode):  # sockets, FIFOs and devices are no model's files
                found.append((f"{rel_dir}{name}", path))
    return sorted(found)


def _read_json(path: str, what: str) -> Any:
    fd, st = _open(path)
    try:
        if st.st_size > MAX_JSON_BYTES:
            raise _Problem(f"{path} is {size_text(st.st_size)}, too big for {what}")
        text = _pread_all(fd, st.st_size, 0)
    finally:
        os.close(fd)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Problem(f"{path} is not valid JSON: {str(exc).splitlines()[0]}") from None


def _index_shards(model_dir: str, names: Container[str]) -> dict[str, list[str]]:
    """{shard: the tensors the index puts in it}, each shard checked to exist."""
    path = os.path.join(model_dir, INDEX)
    weight_map = _read_json(path, "a safetensors index")
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise _Problem(f"{path} has no weight_map naming each tensor's file")
    shards: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise _Problem(f"{path} maps {_q(tensor)} to a JSON {_json_type(shard)}, not a file name")
        clean = posixpath.normpath(shard)
        if clean.startswith(("/", "../")) or clean in ("..", "."):
            raise _Problem(f"{path} names {_q(shard)}, which is outside {model_dir}")
        shards.setdefault(clean, []).append(tensor)
    for shard in sorted(shards):
        if shard not in names:
            raise _Problem(f"{path} names {shard}, which is missing")
    return shards


def _shards(model_dir: str, names: list[str]) -> tuple[dict[str, list[str]], str]:
    """{shard: tensors the index puts there} and the index's path, or every top-level
    *.safetensors with no index."""
    if INDEX in names:
        return _index_shards(model_dir, set(names)), os.path.join(model_dir, INDEX)
    shards: dict[str, list[str]] = {n: [] for n in names if "/" not in n and n.endswith(".safetensors")}
    if shards:
        return shards, ""
    other = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    found = f" (it holds {other[0]}{' and more' if len(other) > 1 else ''})" if other else ""
    raise _Problem(
        f"{NO_SAFETENSORS} {model_dir}{found}: a .bin or .pt checkpoint cannot be sized "
        "without loading it. Convert it to safetensors."
    )


class _Present:
    """The relative names of the files in `top`, asked one at a time."""

    def __init__(self, top: str) -> None:
        self.top = top

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and os.path.isfile(os.path.join(self.top, name))


def weight_files(dirs: list[str]) -> list[str]:
    """The weight files a start reads, directory by directory, each in name order (the loader's):
    the shards the index names, else every top-level *.safetensors, else *.bin, *.pt and *.pth.
    A directory that cannot be read gives none: scan names its problem. A file reached by two
    names (a Hugging Face cache's links) is listed once."""
    out: list[str] = []
    seen = set()
    for model_dir in dirs:
        try:
            names = sorted(n for n in os.listdir(model_dir) if not n.startswith("."))
            if INDEX in names:
                shards = sorted(_index_shards(model_dir, _Present(model_dir)))
            else:
                shards = [n for n in names if n.endswith(".safetensors")]
                shards = shards or [n for n in names if n.endswith((".bin", ".pt", ".pth"))]
        except (OSError, _Problem):
            continue
        for shard in shards:
            path = os.path.join(model_dir, shard)
            real = os.path.realpath(path)
            if real not in seen and os.path.isfile(path):
                seen.add(real)
                out.append(path)
    return out


def _group(name: str) -> tuple[str, int | None]:
    """(`model.layers.*.mlp.experts.*.up_proj.weight`, 3) for `model.layers.3.mlp.experts.17...`."""
    parts = name.split(".")
    layer = None
    for i, part in enumerate(parts):
        if part.isascii() and part.isdigit():
            if layer is None and i and parts[i - 1] in LAYER_PARENTS:
                layer = int(part)
            parts[i] = "*"
    return ".".join(parts), layer


def scan(
    model_dir: str,
    *,
    deadline_s: float = 30.0,
    samples: int = 16,
    sample_bytes: int = 65536,
    cache_dir: str = "",
) -> dict:
    """A compact summary of the model directory: its files, their sizes and sampled digests,
    the tensors grouped by layer, and one fingerprint over all of it.

    Read-only, and bounded: it stops with an error at the deadline. A hung network mount can
    still block one read past it. Headers are parsed one file at a time. The sampled digest
    catches a changed byte at a sampled offset only (see sample_offsets), not one between them.

    With `cache_dir`, a scan of a directory whose files all have the size, mtime and inode they
    had at the last scan is that scan's result (a 61-shard header takes seconds to parse), with
    `cached` true. The cache is written there; the model directory is never written."""
    start = time.monotonic()
    key = _stat_key(model_dir, samples, sample_bytes, start + deadline_s) if cache_dir else ""
    if key:
        cached = _cached(cache_dir, model_dir, key)
        if cached is not None:
            cached["elapsed_s"] = round(time.monotonic() - start, 3)
            return cached
    result = _fresh(model_dir, start, deadline_s, samples, sample_bytes)
    if key and not result["error"]:
        _store(cache_dir, model_dir, key, result)
    return result


#: Bump when scan's result changes shape or meaning: older cached scans are then not used.
CACHE_VERSION = 2


def _stat_key(model_dir: str, samples: int, sample_bytes: int, deadline: float) -> str:
    """What a cached scan of `model_dir` must match: every file's name, size, mtime and inode, and
    how it is sampled; "" when the directory cannot be walked (the fresh scan then says why)."""
    try:
        found = _walk(model_dir, deadline)
        stats = []
        for rel, path in found:
            st = os.stat(path)
            stats.append([rel, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev])
    except (OSError, _Problem, _Deadline):
        return ""
    text = json.dumps([CACHE_VERSION, samples, sample_bytes, stats])
    return hashlib.sha256(text.encode()).hexdigest()


def _cache_path(cache_dir: str, model_dir: str) -> str:
    return os.path.join(cache_dir, hashlib.sha256(model_dir.encode()).hexdigest()[:24] + ".json")


def _cached(cache_dir: str, model_dir: str, key: str) -> dict | None:
    """The cached scan of `model_dir` under `key`, or None (absent, stale or unreadable)."""
    try:
        with open(_cache_path(cache_dir, model_dir)) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("scan"), dict):
        return None
    return {**data["scan"], "cached": True}


def _store(cache_dir: str, model_dir: str, key: str, result: dict) -> None:
    """Write the scan for next time (root-only, atomically); a cache that cannot be written is
    no problem: the next scan reads the files again."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        path = _cache_path(cache_dir, model_dir)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            json.dump({"key": key, "scan": result}, fh)
        os.replace(tmp, path)
    except OSError:
        return


def _fresh(model_dir: str, start: float, deadline_s: float, samples: int, sample_bytes: int) -> dict:
    """scan() without its cache."""
    result: dict[str, Any] = {
        "path": model_dir,
        "error": "",
        "note": "",
        "files": [],
        "config_sha256": "",
        "weights": [],
        "tensor_bytes": 0,
        "shards": 0,
        "digest": "",
        "elapsed_s": 0.0,
    }
    try:
        _scan(model_dir, result, start + deadline_s, samples, sample_bytes)
    except _Deadline as late:
        result["timed_out"] = True
        result["error"] = (
            f"scanning {model_dir} took over {deadline_s:g} s (stopped at {late}): "
            "the disk is slow, or the directory is large"
        )
    except _Problem as problem:
        result["error"] = str(problem)
    except OSError as exc:
        result["error"] = _os_error(getattr(exc, "filename", None) or model_dir, exc)
    if result["error"]:
        result["digest"] = ""
    result["elapsed_s"] = round(time.monotonic() - start, 3)
    return result


def _scan(model_dir: str, result: dict, deadline: float, samples: int, sample_bytes: int) -> None:
    """Fill `result` (scan's dict); _Problem at the first problem."""
    try:
        if not stat.S_ISDIR(os.stat(model_dir).st_mode):
            raise _Problem(f"{model_dir} is not a directory")
    except OSError as exc:
        raise _Problem(_os_error(model_dir, exc)) from None
    found = [(rel, path) for rel, path in _walk(model_dir, deadline) if loaded(rel)]
    try:
        shards, index = _shards(model_dir, [rel for rel, _path in found])
    except _Problem as problem:
        if not str(problem).startswith(NO_SAFETENSORS):
            raise
        shards, index = {}, ""  # the files are still compared; only their sizes in memory are unknown
        result["note"] = str(problem)
    groups: dict[tuple, list] = {}
    headers = []
    for rel, path in found:
        _check_deadline(deadline, path)
        fd, st = _open(path)
        try:
            sha = _content_sha256(fd, st.st_size, samples, sample_bytes, deadline, path)
            if rel == "config.json":
                result["config_sha256"] = (
                    sha if st.st_size <= FULL_HASH_BYTES else _full_sha256(fd, deadline, path)
                )
            if rel in shards:
                tensors, _length, header_sha = _header(fd, st.st_size, path, MAX_HEADER_BYTES)
                _check_index(tensors, shards[rel], index, rel)
                result["tensor_bytes"] += _add_groups(groups, tensors)
                result["shards"] += 1
                headers.append(f"{rel}\0{header_sha}\n")
        finally:
            os.close(fd)
        result["files"].append({"name": rel, "size": st.st_size, "sha256": sha})
    result["weights"] = [
        {"pattern": p, "layer": layer, "dtype": d, "count": c, "bytes": b, "shape": list(s)}
        for (p, layer, d), (c, b, s) in sorted(groups.items(), key=_group_order)
    ]
    digest = hashlib.sha256()
    for f in result["files"]:
        digest.update(f"{f['name']}\0{f['size']}\0{f['sha256']}\n".encode())
    digest.update(f"config {result['config_sha256']}\n".encode())
    digest.update("".join(headers).encode())
    result["digest"] = digest.hexdigest()


#: Top-level files a server reads besides its weights: config, tokenizer, chat template, remote
#: code. Everything else (README.md, Meta's original/ checkpoint, training logs) is no part of
#: what SGLang loads, and may differ between two downloads of one model.
READ_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".json",
    ".py",
    ".model",
    ".tiktoken",
    ".txt",
    ".jinja",
)
NOT_READ = ("readme", "license", "notice", "use_policy")


def loaded(rel: str) -> bool:
    """Whether a file of a model directory (its relative name) is one a server loads."""
    low = rel.lower()
    return "/" not in rel and low.endswith(READ_SUFFIXES) and not low.startswith(NOT_READ)


def _check_index(tensors: dict, expected: list[str], index: str, shard: str) -> None:
    for name in expected:
        if name not in tensors:
            raise _Problem(f"{index} puts {_q(name)} in {shard}, whose header does not have it")


def _add_groups(groups: dict[tuple, list], tensors: dict) -> int:
    """Add one shard's tensors to `groups`; their bytes."""
    total = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        pattern, layer = _group(name)
        group = groups.get((pattern, layer, dtype))
        if group is None:
            groups[(pattern, layer, dtype)] = [1, nbytes, shape]
        else:
            group[0] += 1
            group[1] += nbytes
        total += nbytes
    return total


def _group_order(item: tuple) -> tuple:
    (pattern, layer, dtype), _rest = item
    return (-1 if layer is None else layer, pattern, dtype)


# --- across hosts --------------------------------------------------------------------------------


def first_difference(scans: dict[str, dict], ref: str = "") -> str:
    """An empty string when every host's scan has the same digest. Otherwise one line: the first host (in
    sorted order) that differs from `ref` (else the first host), and the most telling difference: a
    missing file, a size, config.json, the weights, then sampled content. A host whose scan failed
    is named with its error."""
    hosts = sorted(scans)
    for host in hosts:
        if scans[host].get("error"):
            return f"{host}: {scans[host]['error']}"
    if not hosts:
        return ""
    ref = ref if ref in scans else hosts[0]
    for host in hosts:
        if scans[host]["digest"] != scans[ref]["digest"]:
            why = _why_different(scans[ref], scans[host], ref, host)
            return f"{host} differs from {ref} in {scans[ref]['path']}: {why}"
    return ""


def files_digest(model_files: dict[str, dict]) -> str:
    """One short name of the files a start reads, `model:3f2a9c1d4e5b+draft:8b0e4f7a1c2d`, from
    each role's scan (or the part of it with its digest). "" when none was scanned."""
    roles = sorted(model_files, key=lambda r: ({"model": 0, "draft": 1}.get(r, 2), r))
    parts = [f"{r}:{model_files[r]['digest'][:12]}" for r in roles if (model_files[r] or {}).get("digest")]
    return "+".join(parts)


def _why_different(a: dict, b: dict, ref: str, host: str) -> str:
    files_a = {f["name"]: f for f in a["files"]}
    files_b = {f["name"]: f for f in b["files"]}
    only = sorted(files_a.keys() ^ files_b.keys())
    if only:
        name = only[0]
        return f"{name} is missing on {host}" if name in files_a else f"{name} is on {host}, not on {ref}"
    common = sorted(files_a)
    for name in common:
        size_a, size_b = files_a[name]["size"], files_b[name]["size"]
        if size_a != size_b:
            text_a, text_b = size_text(size_a, 2), size_text(size_b, 2)
            if text_a == text_b:
                text_a, text_b = f"{size_a} bytes", f"{size_b} bytes"
            return f"{name}: size {text_b} on {host}, {text_a} on {ref}"
    if a["config_sha256"] != b["config_sha256"]:
        return "config.json differs"
    weights = _weights_difference(a["weights"], b["weights"], ref, host)
    if weights:
        return weights
    for name in common:
        sha_a, sha_b = files_a[name]["sha256"], files_b[name]["sha256"]
        if sha_a != sha_b:
            how = "whole file" if files_a[name]["size"] <= FULL_HASH_BYTES else "sampled content"
            return f"{name}: sha256 {sha_b[:8]}... on {host}, {sha_a[:8]}... on {ref} ({how})"
    return "a safetensors header differs in tensor order or __metadata__ (same tensors, sizes and samples)"


def _weights_difference(a: list[dict], b: list[dict], ref: str, host: str) -> str:
    def key(g: dict) -> tuple:
        return (-1 if g["layer"] is None else g["layer"], g["pattern"], g["dtype"])

    groups_a, groups_b = {key(g): g for g in a}, {key(g): g for g in b}
    for k in sorted(groups_a.keys() | groups_b.keys()):
        ga, gb = groups_a.get(k), groups_b.get(k)
        layer = "" if k[0] == -1 else f"layer {k[0]}, "
        what = f"weights {k[1]} ({layer}{k[2]})"
        if ga is None or gb is None:
            return f"{what} {'are missing' if gb is None else 'are only'} on {host}"
        if (ga["count"], ga["bytes"], ga["shape"]) != (gb["count"], gb["bytes"], gb["shape"]):
            return f"{what}: {_group_text(gb)} on {host}, {_group_text(ga)} on {ref}"
    return ""


def _group_text(g: dict) -> str:
    return f"{g['count']} x {_short(g['shape'])}, {size_text(g['bytes'], 2)}"


# --- the page cache ------------------------------------------------------------------------------


class _Mincore:
    """libc's mmap, mincore and munmap through ctypes."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self.mincore = libc.mincore
        self.mincore.restype = ctypes.c_int
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        self.munmap = libc.munmap
        self.munmap.restype = ctypes.c_int
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.vec = (ctypes.c_ubyte * (WINDOW_BYTES // self.page))()
        self.map_failed = ctypes.c_void_p(-1).value  # (void *) -1

    def pages(self, fd: int, offset: int, length: int) -> bytes:
        """One byte a page of [offset, offset + length): 1 when in the page cache, else 0."""
        addr = self.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr is None or addr == self.map_failed:
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            if self.mincore(addr, length, self.vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            self.munmap(addr, length)
        count = -(-length // self.page)
        return ctypes.string_at(self.vec, count).translate(_LOW_BIT)


_MINCORE: list[_Mincore | None] = []


def _api() -> _Mincore | None:
    """The ctypes calls, loaded once; None where this libc has no mincore."""
    if not _MINCORE:
        try:
            _MINCORE.append(_Mincore())
        except (OSError, AttributeError, ValueError):
            _MINCORE.append(None)
    return _MINCORE[0]


def _mincore_tells(path: str, st: os.stat_result) -> bool:
    """Whether mincore tells the truth about this file. Since Linux 5.0 it reports every page
    resident unless the caller owns the file, may write it, or is root (CAP_FOWNER)."""
    euid = os.geteuid()
    return euid == 0 or st.st_uid == euid or os.access(path, os.W_OK)


def _windows(fd: int, size: int, api: _Mincore) -> Iterator[tuple[int, bytes]]:
    """(offset, page bits) for each window of the file, computed as it is reached."""
    for offset in range(0, size, WINDOW_BYTES):
        yield offset, api.pages(fd, offset, min(WINDOW_BYTES, size - offset))


def resident(paths: list[str]) -> tuple[int, int]:
    """(bytes of these files in the page cache, their total bytes). The first is -1 when it
    cannot be known: no mincore, a file unreadable, or mincore not allowed to tell."""
    api = _api()
    known = api is not None
    cached = total = 0
    for path in paths:
        try:
            fd, st = _open(path)
        except _Problem:
            known = False
            continue
        total += st.st_size
        try:
            if known and api is not None and _mincore_tells(path, st):
                for offset, bits in _windows(fd, st.st_size, api):
                    in_cache = bits.count(1) * api.page
                    cached += min(in_cache, st.st_size - offset)
            else:
                known = False
        except OSError:
            known = False
        finally:
            os.close(fd)
    return (cached if known else -1), total


def _cold_ranges(fd: int, path: str, st: os.stat_result) -> Iterator[tuple[int, int]]:
    """[begin, end) ranges of the file not in the page cache; the whole file where that cannot
    be known."""
    api = _api()
    if api is None or not _mincore_tells(path, st):
        yield 0, st.st_size
        return
    try:
        for offset, bits in _windows(fd, st.st_size, api):
            for run in re.finditer(b"\x00+", bits):
                yield offset + run.start() * api.page, min(st.st_size, offset + run.end() * api.page)
    except OSError:
        yield 0, st.st_size


def _read_range(
    fd: int, begin: int, end: int, view: memoryview, budget: int, deadline: float
) -> tuple[int, str]:
    """Read [begin, end) through `view`: (bytes read, "" or why it stopped: budget, deadline)."""
    got = 0
    while begin < end:
        if time.monotonic() >= deadline:
            return got, "deadline"
        n = min(len(view), end - begin, budget - got)
        if n <= 0:
            return got, "budget"
        read = os.preadv(fd, [view[:n]], begin)
        if read <= 0:  # the file shrank
            break
        got += read
        begin += read
    return got, ""


def read_ahead(paths: list[str], budget_bytes: int, deadline_s: float) -> dict:
    """Read into the page cache the parts of these files that are not there yet.

    Files are read in the order given: the loader reads shards in name order, so the caller
    passes them sorted, and a stop at the budget or the deadline leaves the first ones whole.
    At most budget_bytes are read, through one 8 MiB buffer. posix_fadvise(WILLNEED) is not
    used: it returns at once, so neither its progress nor its end can be measured."""
    start = time.monotonic()
    before, total = resident(paths)
    view = memoryview(bytearray(CHUNK_BYTES))
    done = files = 0
    stopped = ""
    for path in paths:
        try:
            fd, st = _open(path)
        except _Problem:
            continue
        files += 1
        try:
            for begin, end in _cold_ranges(fd, path, st):
                got, stopped = _read_range(fd, begin, end, view, budget_bytes - done, start + deadline_s)
                done += got
                if stopped:
                    break
        except OSError:
            pass  # a file that fails to read is left cold: this is only a warm-up
        finally:
            os.close(fd)
        if stopped:
            break
    after, _total = resident(paths)
    return {
        "files": files,
        "read_bytes": done,
        "resident_before": before,
        "resident_after": after,
        "total_bytes": total,
        "seconds": round(time.monotonic() - start, 3),
        "stopped": stopped,
    }


def available_bytes(field: str = "MemAvailable") -> int:
    """A /proc/meminfo field in bytes (MemAvailable: what the page cache can grow into without
    swapping; MemTotal). -1 when it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return -1
