"""A model directory's files (plugins/module_utils/orchestrator_host/modelfiles.py): safetensors
headers read without the data, a directory scanned and compared across hosts, and the page cache
measured and warmed. Real files throughout; big shards are sparse, so 500 GB costs nothing."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import paths

mf = paths.module_utils("orchestrator_host.modelfiles")

MiB = 2**20
GiB = 2**30
BITS = {"BF16": 16, "F16": 16, "F32": 32, "I32": 32, "I64": 64, "U8": 8, "F8_E4M3": 8, "F4": 4, "F6_E2M3": 6}


def nbytes(dtype: str, shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * BITS[dtype] // 8


def header_file(path: Path, header: bytes | str | dict, data: bytes = b"", size: int | None = None) -> Path:
    """A file of the 8-byte length, `header`, then `data`; sparse up to `size` when given."""
    raw = json.dumps(header).encode() if isinstance(header, dict) else header
    raw = raw.encode() if isinstance(raw, str) else raw
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    if size is not None:
        os.truncate(path, size)
    return path


def safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], data: bytes | None = None) -> Path:
    """A sound safetensors file. The data is `data` repeated, or a sparse hole when None."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # as the reference writer pads it
    if data is None:
        return header_file(path, raw, size=8 + len(raw) + offset)
    body = (data * (offset // max(len(data), 1) + 1))[:offset]
    return header_file(path, raw, body)


def model_dir(root: Path, layers: int = 2, data: bytes | None = b"\x01\x02") -> Path:
    """A two-shard model with an index and a config, like a Hugging Face download."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": layers}))
    weight_map = {}
    for shard in range(2):
        name = f"model-{shard + 1:05d}-of-00002.safetensors"
        tensors = {"model.embed_tokens.weight": ("BF16", [128, 64])} if shard == 0 else {}
        for layer in range(layers):
            if layer % 2 == shard:
                tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = ("BF16", [64, 64])
                tensors[f"model.layers.{layer}.mlp.up_proj.weight"] = ("BF16", [256, 64])
        safetensors(root / name, tensors, data)
        weight_map.update(dict.fromkeys(tensors, name))
    (root / mf.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


# --- read_header ----------------------------------------------------------------------------------


def test_read_header_gives_each_tensor_and_reads_no_data(tmp_path: Path) -> None:
    tensors = {"a": ("BF16", [3, 5]), "scale": ("F4", [4, 6]), "f6": ("F6_E2M3", [4]), "s": ("I64", [])}
    path = safetensors(tmp_path / "m.safetensors", tensors, data=None)
    got, length, error = mf.read_header(str(path))
    assert error == ""
    assert got == {
        "a": ("BF16", (3, 5), 30),
        "scale": ("F4", (4, 6), 12),  # half a byte each
        "f6": ("F6_E2M3", (4,), 3),
        "s": ("I64", (), 8),  # a scalar: one element
    }
    assert length % 8 == 0 and length > 0


def test_a_header_claiming_a_petabyte_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = header_file(tmp_path / "huge.safetensors", b"{}", size=4 * GiB + 200 * MiB)
    with open(path, "r+b") as fh:
        fh.write(struct.pack("<Q", 2**50))
    tensors, _, error = mf.read_header(str(path))
    assert tensors == {}
    assert error == (
        f"{path}: the header claims 1.0 PiB, the file has 4.2 GiB: it is cut short, or not a safetensors file"
    )


def tensor(dtype: object = "BF16", shape: object = (2, 2), offsets: object = (0, 8)) -> dict:
    return {
        "dtype": dtype,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "data_offsets": offsets,
    }


#: (case, header, data bytes after it, words the user reads)
HOSTILE = [
    ("not UTF-8", b"{\xff\xfe}", b"", "the header is not UTF-8 (byte 1): not a safetensors file"),
    ("not JSON", b"{nope", b"", "the header is not valid JSON (Expecting property name"),
    ("a list", b"[1, 2]", b"", "the header is a JSON list, not an object"),
    ("nested deep", b"[" * 100_000, b"", "the header's JSON is nested too deeply"),
    ("entry a number", {"w": 3}, b"", "tensor 'w' is a JSON number, not an object"),
    ("no dtype", {"w": {"shape": [1], "data_offsets": [0, 2]}}, b"", "tensor 'w' has no dtype"),
    ("no shape or offsets", {"w": {"dtype": "BF16"}}, b"", "tensor 'w' has no shape or data_offsets"),
    ("dtype a number", {"w": tensor(dtype=5)}, b"", "tensor 'w': dtype is a JSON number, not a string"),
    ("unknown dtype", {"w": tensor(dtype="F8_E4M3FN")}, b"", "tensor 'w' has unknown dtype 'F8_E4M3FN'"),
    ("shape a string", {"w": tensor(shape="2x2")}, b"", "tensor 'w': shape is a JSON string, not a list"),
    ("negative dim", {"w": tensor(shape=(2, -2))}, b"", "tensor 'w': shape [2, -2] has a negative size"),
    ("fractional dim", {"w": tensor(shape=(2, 1.5))}, b"", "shape [2, 1.5] has a size that is not a whole"),
    ("boolean dim", {"w": tensor(shape=(2, True))}, b"", "shape [2, true] has a size that is not a whole"),
    ("one offset", {"w": tensor(offsets=[8])}, b"", "data_offsets must be [begin, end], two whole numbers"),
    (
        "offsets reversed",
        {"w": tensor(offsets=[8, 0])},
        b"",
        "data_offsets [8, 0] must have 0 <= begin <= end",
    ),
    (
        "size mismatch",
        {"w": tensor(offsets=[0, 6])},
        b"\0" * 6,
        "tensor 'w' holds 6 bytes, but BF16 [2, 2] needs 8",
    ),
    ("odd F4", {"w": tensor("F4", (3,), [0, 1])}, b"\0", "F4 [3] is 12 bits, not a whole number of bytes"),
    (
        "past the end",
        {"w": tensor()},
        b"\0" * 5,
        "tensor 'w' ends 8 bytes into the data, but the file holds 5",
    ),
    (
        "a gap",
        {"w": tensor(offsets=[4, 12])},
        b"\0" * 12,
        "tensor 'w' starts at byte 4 of the data and leaves a gap",
    ),
    (
        "an overlap",
        {"a": tensor(), "b": tensor(offsets=[4, 12])},
        b"\0" * 12,
        "tensor 'b' starts at byte 4 of the data and overlaps the tensor before it",
    ),
    ("bytes after", {"w": tensor()}, b"\0" * 9, "the file has 1 byte after the last tensor"),
    ("bad metadata", {"__metadata__": {"n": 1}}, b"", "__metadata__ must map names to strings"),
    ("newline in a name", {"a\nb": 3}, b"", "tensor 'a\\nb' is a JSON number"),
]


@pytest.mark.parametrize(("header", "data", "words"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_each_bad_header_is_one_line_naming_the_file(
    tmp_path: Path, header: object, data: bytes, words: str
) -> None:
    path = header_file(tmp_path / "bad.safetensors", header, data)  # type: ignore[arg-type]
    tensors, _, error = mf.read_header(str(path))
    print(error)
    assert tensors == {}
    assert error.startswith(f"{path}: ")
    assert words in error
    assert "\n" not in error


def test_bad_files_are_named_with_what_is_wrong(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"abc")
    cut = header_file(tmp_path / "cut.safetensors", b"{}" * 50)
    cut.write_bytes(cut.read_bytes()[:40])
    big = header_file(tmp_path / "big.safetensors", b"{}", size=300 * MiB)
    with open(big, "r+b") as fh:
        fh.write(struct.pack("<Q", 200 * MiB))
    loop = tmp_path / "loop.safetensors"
    loop.symlink_to(loop)
    errors = {
        p.name: mf.read_header(str(p))[2] for p in (short, cut, big, loop, tmp_path / "gone.safetensors")
    }
    errors["a directory"] = mf.read_header(str(tmp_path))[2]
    assert errors == {
        "short.safetensors": f"{short}: 3 bytes, too short for a safetensors file (8-byte length first)",
        "cut.safetensors": f"{cut}: the header claims 100 bytes, the file has 40 bytes: "
        "it is cut short, or not a safetensors file",
        "big.safetensors": f"{big}: the header claims 200.0 MiB, more than the 100.0 MiB a header may have",
        "loop.safetensors": f"{loop} is a symlink loop",
        "gone.safetensors": f"{tmp_path / 'gone.safetensors'} does not exist",
        "a directory": f"{tmp_path} is not a regular file",
    }


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = safetensors(tmp_path / "m.safetensors", {"a": ("BF16", [2])}, b"\0")
    path.chmod(0)
    assert mf.read_header(str(path))[2] == f"{path} is unreadable: permission denied"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=2**64 - 1), st.booleans())
def test_random_bytes_never_raise(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, n: int, lie: bool
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    path.write_bytes(struct.pack("<Q", n) + body if lie else body)
    tensors, length, error = mf.read_header(str(path))
    assert isinstance(tensors, dict) and isinstance(length, int) and isinstance(error, str)
    assert (tensors == {}) or error == ""


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.sampled_from(["BF16", "F4", "x"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "w"]), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), JSON, max_size=3), st.binary(max_size=32))
def test_random_headers_never_raise(
    tmp_path_factory: pytest.TempPathFactory, header: dict, data: bytes
) -> None:
    path = header_file(tmp_path_factory.mktemp("fuzz") / "f.safetensors", json.dumps(header), data)
    tensors, _, error = mf.read_header(str(path))
    assert isinstance(tensors, dict) and isinstance(error, str)
    assert "\n" not in error


# --- scan -----------------------------------------------------------------------------------------


def test_a_sound_directory_scans_to_files_weights_and_a_digest(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m", layers=4)
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("a b c")
    (root / ".cache").mkdir()  # huggingface_hub's per-host download notes
    (root / ".cache" / "note").write_text(str(time.time()))
    result = mf.scan(str(root))
    print(json.dumps(result, indent=1)[:1500])
    assert result["error"] == ""
    assert [f["name"] for f in result["files"]] == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        mf.INDEX,
    ]  # what a server reads: not the tokenizer/ folder, nor huggingface_hub's .cache
    config = (root / "config.json").read_bytes()
    assert result["config_sha256"] == hashlib.sha256(config).hexdigest()
    assert result["files"][0] == {
        "name": "config.json",
        "size": len(config),
        "sha256": result["config_sha256"],
    }
    assert result["shards"] == 2
    assert result["tensor_bytes"] == 128 * 64 * 2 + 4 * (64 * 64 + 256 * 64) * 2
    assert result["weights"][:3] == [
        {
            "pattern": "model.embed_tokens.weight",
            "layer": None,
            "dtype": "BF16",
            "count": 1,
            "bytes": 16384,
            "shape": [128, 64],
        },
        {
            "pattern": "model.layers.*.mlp.up_proj.weight",
            "layer": 0,
            "dtype": "BF16",
            "count": 1,
            "bytes": 32768,
            "shape": [256, 64],
        },
        {
            "pattern": "model.layers.*.self_attn.q_proj.weight",
            "layer": 0,
            "dtype": "BF16",
            "count": 1,
            "bytes": 8192,
            "shape": [64, 64],
        },
    ]
    assert len(result["digest"]) == 64
    assert set(result) == {
        "path",
        "error",
        "note",
        "files",
        "config_sha256",
        "weights",
        "tensor_bytes",
        "shards",
        "digest",
        "elapsed_s",
    }


def moe_shard(path: Path, layer: int, experts: int) -> dict[str, str]:
    """One layer of a Kimi-K2-like int4 MoE: packed weights, scales and shapes per expert. Sparse."""
    tensors: dict[str, tuple[str, list[int]]] = {
        f"model.layers.{layer}.self_attn.q_proj.weight": ("BF16", [7168, 1536]),
        f"model.layers.{layer}.input_layernorm.weight": ("BF16", [7168]),
    }
    for e in range(experts):
        for proj, (rows, cols) in {
            "gate_proj": (2048, 7168),
            "up_proj": (2048, 7168),
            "down_proj": (7168, 2048),
        }.items():
            base = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
            tensors[f"{base}.weight_packed"] = ("I32", [rows, cols // 8])
            tensors[f"{base}.weight_scale"] = ("BF16", [rows, cols // 32])
            tensors[f"{base}.weight_shape"] = ("I64", [2])
    safetensors(path, tensors, data=None)
    return dict.fromkeys(tensors, path.name)


def test_a_moe_groups_into_few_weights_with_every_byte(tmp_path: Path) -> None:
    weight_map = {}
    for layer in range(3):
        weight_map.update(
            moe_shard(tmp_path / f"model-{layer + 1:05d}-of-00003.safetensors", layer, experts=8)
        )
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / mf.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    result = mf.scan(str(tmp_path))
    assert result["error"] == ""
    groups = {(g["pattern"], g["layer"], g["dtype"]): g for g in result["weights"]}
    assert len(groups) == 3 * (2 + 9)
    packed = groups[("model.layers.*.mlp.experts.*.gate_proj.weight_packed", 1, "I32")]
    assert packed == {
        "pattern": "model.layers.*.mlp.experts.*.gate_proj.weight_packed",
        "layer": 1,
        "dtype": "I32",
        "count": 8,
        "bytes": 8 * 2048 * 896 * 4,
        "shape": [2048, 896],
    }
    assert sum(g["bytes"] for g in result["weights"]) == result["tensor_bytes"]
    assert result["tensor_bytes"] == sum(
        os.path.getsize(tmp_path / n) for n in set(weight_map.values())
    ) - sum(8 + struct.unpack("<Q", (tmp_path / n).open("rb").read(8))[0] for n in set(weight_map.values()))


def test_61_sparse_moe_shards_scan_quickly(tmp_path: Path) -> None:
    """A 61-layer, 384-expert model (about 540 GB, sparse on disk): the scan's time is printed."""
    weight_map = {}
    for layer in range(61):
        weight_map.update(
            moe_shard(tmp_path / f"model-{layer + 1:05d}-of-00061.safetensors", layer, experts=384)
        )
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / mf.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    start = time.monotonic()
    result = mf.scan(str(tmp_path))
    took = time.monotonic() - start
    print(
        f"61 shards, {len(weight_map)} tensors, {mf.size_text(result['tensor_bytes'])}: "
        f"{took:.2f} s, {len(result['weights'])} groups, summary {len(json.dumps(result))} bytes"
    )
    assert result["error"] == ""
    assert result["shards"] == 61
    assert len(result["weights"]) == 61 * 11


def scan_error(root: Path, **kwargs: float) -> str:
    result = mf.scan(str(root), **kwargs)
    assert result["digest"] == ""
    print(result["error"])
    return result["error"]


def test_each_broken_directory_is_one_line_naming_the_file(tmp_path: Path) -> None:
    errors = {}
    root = model_dir(tmp_path / "missing-shard")
    (root / "model-00002-of-00002.safetensors").unlink()
    errors["missing shard"] = scan_error(root)
    root = model_dir(tmp_path / "index-lies")
    index = json.loads((root / mf.INDEX).read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors"
    (root / mf.INDEX).write_text(json.dumps(index))
    errors["index lies"] = scan_error(root)
    root = model_dir(tmp_path / "outside")
    (root / mf.INDEX).write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    errors["outside"] = scan_error(root)
    root = model_dir(tmp_path / "no-map")
    (root / mf.INDEX).write_text("[]")
    errors["no weight_map"] = scan_error(root)
    root = model_dir(tmp_path / "bad-shard")
    (root / "model-00001-of-00002.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"not json at all!")
    errors["bad shard"] = scan_error(root)
    root = tmp_path / "bin"
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "pytorch_model.bin").write_bytes(b"\0" * 100)
    binary = mf.scan(str(root))  # still compared across hosts; only its size in memory is unknown
    assert binary["error"] == "" and binary["digest"] and binary["shards"] == 0
    errors["a .bin"] = binary["note"]
    errors["gone"] = scan_error(tmp_path / "gone")
    errors["a file"] = scan_error(root / "config.json")
    root = model_dir(tmp_path / "late")
    errors["late"] = scan_error(root, deadline_s=0.0)
    m = tmp_path
    assert errors == {
        "missing shard": f"{m}/missing-shard/{mf.INDEX} names model-00002-of-00002.safetensors, "
        "which is missing",
        "index lies": f"{m}/index-lies/{mf.INDEX} puts 'model.layers.9.mlp.up_proj.weight' in "
        "model-00002-of-00002.safetensors, whose header does not have it",
        "outside": f"{m}/outside/{mf.INDEX} names '../../etc/passwd', which is outside {m}/outside",
        "no weight_map": f"{m}/no-map/{mf.INDEX} has no weight_map naming each tensor's file",
        "bad shard": f"{m}/bad-shard/model-00001-of-00002.safetensors: the header is not valid JSON "
        "(Expecting value at line 1, column 1)",
        "a .bin": f"no *.safetensors files in {m}/bin (it holds pytorch_model.bin): a .bin or .pt "
        "checkpoint cannot be sized without loading it. Convert it to safetensors.",
        "gone": f"{m}/gone does not exist",
        "a file": f"{m}/bin/config.json is not a directory",
        "late": f"scanning {m}/late took over 0 s (stopped at {m}/late): "
        "the disk is slow, or the directory is large",
    }


def test_symlinks_are_followed_but_loops_and_dead_links_are_named(tmp_path: Path) -> None:
    """A Hugging Face cache: snapshots/REV/ holds links into blobs/."""
    real = model_dir(tmp_path / "real")
    snapshot = tmp_path / "hub" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "blobs").mkdir()
    for file in real.iterdir():
        blob = tmp_path / "hub" / "blobs" / file.name.replace(".", "_")
        file.rename(blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    linked = mf.scan(str(snapshot))
    assert linked["error"] == ""
    assert linked["digest"] == mf.scan(str(model_dir(tmp_path / "copy")))["digest"]

    (snapshot / "extra.json").symlink_to("nowhere.json")
    assert scan_error(snapshot) == f"{snapshot}/extra.json is a broken symlink to nowhere.json"
    (snapshot / "extra.json").unlink()
    (snapshot / "a.json").symlink_to("b.json")
    (snapshot / "b.json").symlink_to("a.json")
    assert scan_error(snapshot) == f"{snapshot}/a.json is a symlink loop"
    (snapshot / "a.json").unlink()
    (snapshot / "b.json").unlink()
    (snapshot / "sub").mkdir()
    (snapshot / "sub" / "up").symlink_to("..")
    error = scan_error(snapshot)
    assert error == f"{snapshot}/sub/up leads back to a directory already read (a symlink loop?)"


# --- first_difference -----------------------------------------------------------------------------


def drafter(root: Path, data: bytes) -> Path:
    """An EAGLE-3 drafter: a config and one 4 MiB model.safetensors with real bytes."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    safetensors(root / "model.safetensors", {"midlayer.mlp.up_proj.weight": ("BF16", [1024, 2048])}, data)
    return root


def test_identical_directories_do_not_differ(tmp_path: Path) -> None:
    scans = {host: mf.scan(str(model_dir(tmp_path / host))) for host in ("lab1", "lab2", "lab3")}
    assert len({s["digest"] for s in scans.values()}) == 1
    assert mf.first_difference(scans) == ""


def test_a_changed_byte_at_a_sampled_offset_is_named(tmp_path: Path) -> None:
    """A drafter of the same size that differs in one byte at a sampled offset is caught. A change
    between the samples is not: the sampled digest reads 1 MiB of each big file, not all of it."""
    data = os.urandom(4096)
    one = drafter(tmp_path / "lab1", data)
    two = drafter(tmp_path / "lab2", data)
    path = two / "model.safetensors"
    size = path.stat().st_size
    offsets = mf.sample_offsets(size, 16, 65536)
    assert offsets[0] == 0 and offsets[-1] == size - 65536 and len(offsets) == 16
    between = offsets[7] + 65536 + 10  # read by no sample
    assert all(not o <= between < o + 65536 for o in offsets)
    flip(path, between)
    scans = {"lab1": mf.scan(str(one)), "lab2": mf.scan(str(two))}
    assert mf.first_difference(scans) == ""  # the documented blind spot
    flip(path, offsets[7] + 100)
    scans = {"lab1": mf.scan(str(one)), "lab2": mf.scan(str(two))}
    sha1, sha2 = (scans[h]["files"][1]["sha256"][:8] for h in ("lab1", "lab2"))
    assert mf.first_difference(scans) == (
        f"lab2 differs from lab1 in {one}: model.safetensors: sha256 {sha2}... on lab2, {sha1}... on lab1 "
        "(sampled content)"
    )


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def lab_pair(tmp_path: Path, case: str) -> tuple[Path, Path]:
    """Two hosts' copies of one model, with a tokenizer file beside the shards."""
    pair = []
    for host in ("lab1", "lab2"):
        root = model_dir(tmp_path / case / host, layers=4)
        (root / "tokenizer.json").write_text('{"model": {}}')
        pair.append(root)
    return pair[0], pair[1]


def difference(lab1: Path, lab2: Path) -> str:
    """first_difference of the two hosts, the directory left out of the line."""
    line = mf.first_difference({"lab2": mf.scan(str(lab2)), "lab1": mf.scan(str(lab1))})
    return line.replace(f" in {lab1}:", ":")


def edit(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))


def big_file(path: Path, size: int) -> None:
    path.parent.mkdir(exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_the_most_telling_difference_is_named(tmp_path: Path) -> None:
    """A missing file, then a size, then config.json, then the weights, then sampled content."""
    lab1, lab2 = lab_pair(tmp_path, "config")
    edit(lab2 / "config.json", b'"hidden_size": 64', b'"hidden_size": 65')  # the same size
    assert difference(lab1, lab2) == "lab2 differs from lab1: config.json differs"
    (lab2 / "tokenizer.json").write_text('{"model": {"x": 1}}')
    assert (
        difference(lab1, lab2)
        == "lab2 differs from lab1: tokenizer.json: size 19 bytes on lab2, 13 bytes on lab1"
    )
    big_file(lab2 / "original" / "consolidated.00.pth", int(4.2 * GiB))  # Meta's copy: never loaded
    assert (
        difference(lab1, lab2)
        == "lab2 differs from lab1: tokenizer.json: size 19 bytes on lab2, 13 bytes on lab1"
    )
    big_file(lab1 / "consolidated.00.pth", int(4.19 * GiB))
    big_file(lab2 / "consolidated.00.pth", int(4.2 * GiB))
    assert difference(lab1, lab2) == (
        "lab2 differs from lab1: consolidated.00.pth: size 4.20 GiB on lab2, 4.19 GiB on lab1"
    )
    big_file(lab2 / "consolidated.00.pth", int(4.19 * GiB) + 3)  # the same when rounded
    assert difference(lab1, lab2) == (
        "lab2 differs from lab1: consolidated.00.pth: "
        f"size {int(4.19 * GiB) + 3} bytes on lab2, {int(4.19 * GiB)} bytes on lab1"
    )
    (lab2 / "special_tokens_map.json").write_text("{}")
    assert difference(lab1, lab2) == "lab2 differs from lab1: special_tokens_map.json is on lab2, not on lab1"
    (lab2 / "special_tokens_map.json").unlink()
    (lab2 / "tokenizer.json").unlink()
    assert difference(lab1, lab2) == "lab2 differs from lab1: tokenizer.json is missing on lab2"

    lab1, lab2 = lab_pair(tmp_path, "weights")
    shard = lab2 / "model-00002-of-00002.safetensors"
    edit(shard, b'"shape": [256, 64]', b'"shape": [64, 256]')  # layer 1's up_proj, the same length
    assert difference(lab1, lab2) == (
        "lab2 differs from lab1: weights model.layers.*.mlp.up_proj.weight (layer 1, BF16): "
        "1 x [64, 256], 32.00 KiB on lab2, 1 x [256, 64], 32.00 KiB on lab1"
    )


def test_a_missing_shard_names_the_host_and_the_shard(tmp_path: Path) -> None:
    lab1, lab2 = lab_pair(tmp_path, "index")
    (lab2 / "model-00002-of-00002.safetensors").unlink()
    assert mf.first_difference({"lab1": mf.scan(str(lab1)), "lab2": mf.scan(str(lab2))}) == (
        f"lab2: {lab2}/{mf.INDEX} names model-00002-of-00002.safetensors, which is missing"
    )
    for root in (lab1, lab2):  # no index: every *.safetensors is a shard
        (root / mf.INDEX).unlink()
    assert (
        difference(lab1, lab2)
        == "lab2 differs from lab1: model-00002-of-00002.safetensors is missing on lab2"
    )


def test_a_model_and_drafter_have_one_short_name(tmp_path: Path) -> None:
    model, draft = mf.scan(str(model_dir(tmp_path / "m"))), mf.scan(str(drafter(tmp_path / "d", b"\1")))
    name = mf.files_digest({"draft": draft, "model": model})
    assert name == f"model:{model['digest'][:12]}+draft:{draft['digest'][:12]}"
    kept = {role: {"digest": s["digest"]} for role, s in (("model", model), ("draft", draft))}
    assert mf.files_digest(kept) == name  # what preflight sends back names the files the same
    assert mf.files_digest({"model": model}) == f"model:{model['digest'][:12]}"
    assert mf.files_digest({}) == ""


def test_weight_files_are_what_a_start_reads_in_load_order(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "m")
    (model / "extra.safetensors").write_bytes(b"")  # not in the index: the loader skips it
    draft = drafter(tmp_path / "d", b"\1")
    (draft / "training_args.json").write_text("{}")
    old = tmp_path / "old"
    old.mkdir()
    for name in ("pytorch_model-00002.bin", "pytorch_model-00001.bin", "config.json"):
        (old / name).write_bytes(b"\0")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(draft / "model.safetensors")
    dirs = [str(model), str(draft), str(old), str(linked), str(tmp_path / "gone")]
    assert mf.weight_files(dirs) == [
        f"{model}/model-00001-of-00002.safetensors",
        f"{model}/model-00002-of-00002.safetensors",
        f"{draft}/model.safetensors",
        f"{old}/pytorch_model-00001.bin",
        f"{old}/pytorch_model-00002.bin",
    ]


# --- the page cache -------------------------------------------------------------------------------


def cold_file(path: Path, size: int) -> Path:
    """A file of random bytes, written out and dropped from the page cache where the kernel will."""
    with open(path, "wb") as fh:
        for _ in range(size // MiB):
            fh.write(os.urandom(MiB))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path


def cold_or_skip(*files: Path) -> None:
    cached, total = mf.resident([str(f) for f in files])
    assert cached >= 0, "mincore answers on Linux"
    if cached > total // 4:
        pytest.skip(f"POSIX_FADV_DONTNEED leaves {cached} of {total} bytes cached on this filesystem")


def test_residency_follows_what_was_read(tmp_path: Path) -> None:
    path = cold_file(tmp_path / "shard", 32 * MiB)
    cold_or_skip(path)
    with open(path, "rb") as fh:
        while fh.read(MiB):
            pass
    assert mf.resident([str(path)]) == (32 * MiB, 32 * MiB)
    (tmp_path / "empty").write_bytes(b"")
    assert mf.resident([str(tmp_path / "empty")]) == (0, 0)
    assert mf.resident([str(path), str(tmp_path / "gone")]) == (-1, 32 * MiB)


def test_read_ahead_reads_in_order_within_its_budget(tmp_path: Path) -> None:
    files = [cold_file(tmp_path / f"model-0000{i}-of-00002.safetensors", 32 * MiB) for i in (1, 2)]
    cold_or_skip(*files)
    names = [str(f) for f in files]
    first = mf.read_ahead(names, budget_bytes=40 * MiB, deadline_s=60)
    print(first)
    assert first["read_bytes"] == 40 * MiB
    assert first["stopped"] == "budget"
    assert (first["files"], first["total_bytes"]) == (2, 64 * MiB)
    assert first["resident_after"] - first["resident_before"] >= 40 * MiB
    assert mf.resident(names[:1]) == (32 * MiB, 32 * MiB)  # the first file whole, then the second

    rest = mf.read_ahead(names, budget_bytes=GiB, deadline_s=60)
    assert rest["read_bytes"] <= 24 * MiB  # only what was still cold
    assert (rest["stopped"], rest["resident_after"]) == ("", 64 * MiB)
    assert mf.read_ahead(names, budget_bytes=GiB, deadline_s=60)["read_bytes"] == 0


def test_read_ahead_stops_at_its_deadline(tmp_path: Path) -> None:
    path = cold_file(tmp_path / "shard", 16 * MiB)
    cold_or_skip(path)
    late = mf.read_ahead([str(path)], budget_bytes=GiB, deadline_s=0)
    assert (late["stopped"], late["read_bytes"]) == ("deadline", 0)


def test_available_memory_is_read() -> None:
    assert mf.available_bytes() > 0


def test_a_cached_scan_is_used_only_while_every_file_is_unchanged(tmp_path: Path) -> None:
    """Preflight scans the same model before every restart: the cache saves the header parsing,
    and a file written since (a new drafter checkpoint under the same path) is read again."""
    d = model_dir(tmp_path / "m")
    cache = str(tmp_path / "cache")
    first = mf.scan(str(d), cache_dir=cache)
    assert not first["error"] and "cached" not in first
    again = mf.scan(str(d), cache_dir=cache)
    assert again["cached"] and again["digest"] == first["digest"]
    assert list((d).glob(".*")) == [] and os.listdir(cache)  # the model directory is never written
    shard = next(d.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the last byte: a sampled offset
    shard.write_bytes(bytes(data))
    changed = mf.scan(str(d), cache_dir=cache)
    assert "cached" not in changed and changed["digest"] != first["digest"]
    assert mf.first_difference({"lab1": first, "lab2": changed}).startswith("lab2 differs from lab1")
