"""The safetensors header validator: every corruption is a CorruptFileError naming the file,
and nothing but a RamstreamError ever escapes it, whatever the bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream.errors import CorruptFileError, RamstreamError
from ramstream.format.safetensors_header import MAX_HEADER_BYTES, parse_header, read_header
from tests.families import write_safetensors


def write_raw(path: Path, header: object, data: bytes, *, pad: bool = True) -> Path:
    """A file with the JSON ``header`` (any object, written as is) and ``data`` after it."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def entry(dtype: object, shape: object, lo: object, hi: object) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [lo, hi]}


def assert_corrupt(path: Path, *words: str) -> None:
    with pytest.raises(CorruptFileError) as info:
        read_header(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message, message


@pytest.fixture
def valid(tmp_path: Path) -> Path:
    path = tmp_path / "ok.safetensors"
    write_safetensors(
        path,
        {
            "a": ("F32", (2, 3), np.arange(6, dtype=np.float32)),
            "b": ("BF16", (5,), np.arange(5, dtype=np.uint16)),
            "c": ("I64", (1,), np.array([7], np.int64)),
        },
    )
    return path


# -- valid files -------------------------------------------------------------------------------


def test_valid_file(valid: Path) -> None:
    header = read_header(valid)
    (n,) = struct.unpack("<Q", valid.read_bytes()[:8])
    start = 8 + n
    assert [(e.name, e.dtype, e.shape, e.offset, e.nbytes) for e in header.tensors] == [
        ("a", "F32", (2, 3), start, 24),
        ("b", "BF16", (5,), start + 24, 10),
        ("c", "I64", (1,), start + 34, 8),
    ]
    assert header.metadata == {"format": "pt"}
    assert header.file_size == valid.stat().st_size


def test_entries_are_ordered_by_offset_not_by_name(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"z": entry("U8", [2], 0, 2), "a": entry("U8", [3], 2, 5)}, b"12345")
    assert [e.name for e in read_header(path).tensors] == ["z", "a"]


def test_empty_and_scalar_tensors(tmp_path: Path) -> None:
    header = {"e": entry("F32", [0, 4], 0, 0), "s": entry("F16", [], 0, 2), "t": entry("U8", [1], 2, 3)}
    path = write_raw(tmp_path / "x.safetensors", header, b"abc")
    got = {e.name: (e.shape, e.nbytes) for e in read_header(path).tensors}
    assert got == {"e": ((0, 4), 0), "s": ((), 2), "t": ((1,), 1)}


def test_no_tensors_at_all(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"__metadata__": {"k": "v"}}, b"")
    assert read_header(path).tensors == ()


# -- truncated, garbage, absurd --------------------------------------------------------------


@pytest.mark.parametrize("keep", [0, 3, 7])
def test_too_short_for_the_length_prefix(valid: Path, keep: int) -> None:
    valid.write_bytes(valid.read_bytes()[:keep])
    assert_corrupt(valid, "too short")


def test_truncated_inside_the_header(valid: Path) -> None:
    valid.write_bytes(valid.read_bytes()[:20])
    assert_corrupt(valid, "truncated")


@pytest.mark.parametrize("cut", [1, 8, 41])
def test_truncated_data(valid: Path, cut: int) -> None:
    valid.write_bytes(valid.read_bytes()[:-cut])
    assert_corrupt(valid, "truncated")


@pytest.mark.parametrize("extra", [b"\0", b"trailing garbage"])
def test_trailing_bytes(valid: Path, extra: bytes) -> None:
    valid.write_bytes(valid.read_bytes() + extra)
    assert_corrupt(valid, "trailing")


@pytest.mark.parametrize("length", [MAX_HEADER_BYTES + 1, 2**40, 2**64 - 1])
def test_absurd_header_length(tmp_path: Path, length: int) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b"{}" + b"\0" * 64)
    assert_corrupt(path, str(length))


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe\x00garbage",  # not UTF-8
        b"{not json}",
        b'{"a": {"dtype": "F32"',  # cut short
        b"[1, 2, 3]",  # JSON, but not an object
        b'"text"',
        b"",
        b"        ",
    ],
)
def test_garbage_header(tmp_path: Path, raw: bytes) -> None:
    path = write_raw(tmp_path / "x.safetensors", raw, b"", pad=False)
    assert_corrupt(path)


def test_not_a_file_at_all(tmp_path: Path) -> None:
    assert_corrupt(tmp_path / "missing.safetensors")
    with pytest.raises(CorruptFileError):
        read_header(tmp_path)  # a directory


# -- offsets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "data", "words"),
    [
        ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, 12, ("'b'", "overlaps")),
        ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 0, 8)}, 8, ("overlaps",)),
        ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, 20, ("'b'", "gap")),
        ({"a": entry("F32", [2], 4, 12)}, 12, ("'a'", "gap")),  # does not start at 0
        ({"a": entry("F32", [2], 0, 8)}, 4, ("truncated",)),  # past the end of the file
        ({"a": entry("F32", [2], 2**62, 2**62 + 8)}, 8, ("gap",)),
        ({"a": entry("F32", [0], 0, 0), "b": entry("U8", [1], 2, 3)}, 3, ("'b'", "gap")),
    ],
)
def test_bad_offsets(tmp_path: Path, header: dict[str, object], data: int, words: tuple[str, ...]) -> None:
    path = write_raw(tmp_path / "x.safetensors", header, b"\0" * data)
    assert_corrupt(path, *words)


@pytest.mark.parametrize(
    "offsets",
    [[8, 0], [0], [0, 8, 16], [-8, 0], [0.0, 8.0], ["0", "8"], None, [0, None]],
)
def test_invalid_offsets(tmp_path: Path, offsets: object) -> None:
    path = write_raw(
        tmp_path / "x.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": offsets}}, b"\0" * 8
    )
    assert_corrupt(path, "'a'", "data_offsets")


# -- shapes and dtypes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("F32", [3], 8), ("BF16", [2, 2], 4), ("I64", [], 4), ("F32", [0], 4), ("U8", [2**40, 2**40], 1)],
)
def test_size_mismatch(tmp_path: Path, dtype: str, shape: list[int], nbytes: int) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"a": entry(dtype, shape, 0, nbytes)}, b"\0" * nbytes)
    assert_corrupt(path, "'a'", "needs")


@pytest.mark.parametrize("shape", [[-1], [2.0], ["2"], None, 2, [[2]], [2, None]])
def test_invalid_shape(tmp_path: Path, shape: object) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"a": entry("F32", shape, 0, 8)}, b"\0" * 8)
    assert_corrupt(path, "'a'", "shape")


@pytest.mark.parametrize("dtype", ["F7", "float32", "f32", "", None, 4])
def test_unknown_dtype(tmp_path: Path, dtype: object) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"a": entry(dtype, [2], 0, 8)}, b"\0" * 8)
    assert_corrupt(path, "'a'", "dtype")


@pytest.mark.parametrize("spec", [None, [1, 2], "F32", 3])
def test_entry_not_an_object(tmp_path: Path, spec: object) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"a": spec}, b"")
    assert_corrupt(path, "'a'")


@pytest.mark.parametrize("metadata", [[1], "text", 5])
def test_metadata_not_an_object(tmp_path: Path, metadata: object) -> None:
    path = write_raw(tmp_path / "x.safetensors", {"__metadata__": metadata}, b"")
    assert_corrupt(path, "__metadata__")


def test_booleans_are_not_sizes(tmp_path: Path) -> None:
    """JSON true/false are not integers (the reference implementation reads usize), but Python's
    bool is an int subclass: shape [true, 2] must not pass as (1, 2)."""
    path = write_raw(tmp_path / "x.safetensors", {"a": entry("F32", [True, 2], 0, 8)}, b"\0" * 8)
    assert_corrupt(path, "'a'", "shape")
    path = write_raw(tmp_path / "y.safetensors", {"a": entry("U8", [1], False, True)}, b"\0")
    assert_corrupt(path, "'a'", "data_offsets")


# -- nothing but RamstreamError escapes --------------------------------------------------------


HOSTILE = {
    # an integer too long for int(): json raises ValueError, not JSONDecodeError
    "long-integer": b'{"a": ' + b"1" * 5000 + b"}",
    "long-dimension": b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}',
    # nesting deeper than the recursion limit: RecursionError
    "deep-array": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a": ' + b'{"b": ' * 50_000 + b"1" + b"}" * 50_001,
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_json_is_a_corrupt_file(tmp_path: Path, kind: str) -> None:
    path = write_raw(tmp_path / "x.safetensors", HOSTILE[kind], b"", pad=False)
    assert_corrupt(path)


JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["F32", "BF16", "F16", "I64", "U8", "dtype", "shape", "data_offsets"]),
)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20,
)
# header-shaped documents, so the fuzz reaches the offset and size checks too
ENTRY = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "BF16", "I64", "U8", "F8_E4M3", "X"]),
        "shape": st.lists(st.integers(-1, 5), max_size=3),
        "data_offsets": st.lists(st.integers(-1, 64), min_size=0, max_size=3),
    }
)
HEADERS = st.dictionaries(st.text(max_size=4), st.one_of(ENTRY, JSON), max_size=4)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _parse_only_ramstream_errors(raw: bytes, data_size: int) -> None:
    try:
        parse_header(Path("fuzz.safetensors"), raw, 8 + len(raw) + data_size)
    except RamstreamError:
        pass


@FUZZ
@given(raw=st.binary(max_size=200), data_size=st.integers(0, 64))
def test_fuzz_random_bytes(raw: bytes, data_size: int) -> None:
    _parse_only_ramstream_errors(raw, data_size)


@FUZZ
@given(doc=st.one_of(JSON, HEADERS), data_size=st.integers(0, 64))
def test_fuzz_json_documents(doc: object, data_size: int) -> None:
    _parse_only_ramstream_errors(json.dumps(doc).encode(), data_size)


@FUZZ
@given(data=st.binary(min_size=0, max_size=300))
def test_fuzz_whole_files(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(data)
    try:
        read_header(path)
    except RamstreamError:
        pass
