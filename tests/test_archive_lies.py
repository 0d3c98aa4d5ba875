""".bin archives that lie (issue 21, class 1): ramstream reads what ``torch.load`` reads or refuses
by name, never another member's bytes, and a small file never costs much memory.

The lies are hand-built zips (``tests/torch_archives.py``: pickles written by name, members by
``zipfile``); where torch is installed each one is also given to ``torch.load`` and ramstream's
reading compared with it. Ordinary content that ramstream does not read is written by
``torch.save`` itself.
"""

from __future__ import annotations

import re
import shlex
import struct
import subprocess
import sys
import textwrap
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from ramstream.errors import CorruptFileError, InputError, RamstreamError, UnsupportedDtypeError
from ramstream.format.checkpoint import open_checkpoint
from ramstream.format.torch_zip import MAX_PICKLE_BYTES, UnsafePickleError
from tests.reader_fuzz import Read, read, torch_reference
from tests.test_cli import in_process, one_line_error
from tests.torch_archives import Call, dumps, members_of, patch_central, rezip, tensor, write_archive

F32 = np.arange(4, dtype=np.float32).tobytes()  # storage '0': 16 bytes
F32_100 = np.arange(100, dtype=np.float32).tobytes()


def installed_torch() -> ModuleType | None:
    try:
        import torch
    except ImportError:  # the CI job without torch
        return None
    return torch


def torch_read(torch: ModuleType, path: Path) -> Read | Exception:
    """What ``torch.load`` gives for ``path`` (or its exception), as ``read`` gives it."""
    return torch_reference(torch)(path)


def outcome(path: Path) -> Read | RamstreamError:
    try:
        return read(path)
    except RamstreamError as exc:
        return exc


# -- a member name held twice ----------------------------------------------------------------


@pytest.mark.parametrize("twice", ["data/0", "data.pkl", "byteorder"])
def test_a_member_name_held_twice_is_refused_by_name(tmp_path: Path, twice: str) -> None:
    """zipfile keeps the last of two equal names, torch's reader may take the first: either could be read."""
    pickled = dumps({"w": tensor("0", 4, (4,))})
    second = {"data/0": F32_100[:16], "data.pkl": dumps({}), "byteorder": b"big"}[twice]
    path = write_archive(tmp_path / "x.bin", pickled, [("data/0", F32), (twice, second)])
    with pytest.raises(CorruptFileError, match=rf"x\.bin: holds two members named 'archive/{twice}'"):
        read(path)


# -- a storage key reused ---------------------------------------------------------------------

BF16 = "torch.BFloat16Storage"
REUSED: dict[str, tuple[dict[str, Call], str | Read]] = {
    # torch.load caches a storage by key: the first reference decides its dtype and size.
    "later-larger-fits": (
        {"a": tensor("0", 4, (2,)), "b": tensor("0", 100, (4,))},
        {"a": ("F32", (2,), F32[:8]), "b": ("F32", (4,), F32)},
    ),
    "later-larger-past-the-storage": (
        {"a": tensor("0", 4, (4,)), "b": tensor("0", 100, (100,))},
        r"tensor 'b' runs past the end of its storage",
    ),
    "first-larger-than-its-member": (
        {"b": tensor("0", 100, (100,)), "a": tensor("0", 4, (4,))},
        r"storage '0' holds 16 bytes but tensor 'b' declares 400",
    ),
    "another-dtype-within": (
        {"a": tensor("0", 4, (4,)), "b": tensor("0", 8, (2,), storage=BF16, offset=1)},
        {"a": ("F32", (4,), F32), "b": ("F32", (2,), F32[4:12])},
    ),
    "another-dtype-past": (
        {"a": tensor("0", 4, (4,)), "b": tensor("0", 8, (8,), storage=BF16)},
        r"tensor 'b' runs past the end of its storage",
    ),
    "empty-first": (
        {"z": tensor("0", 0, (0,), storage=BF16), "a": tensor("0", 4, (4,))},
        r"storage '0' holds 16 bytes but tensor 'z' declares 0",
    ),
}


@pytest.mark.parametrize("case", list(REUSED))
def test_a_reused_storage_key_reads_what_torch_load_reads_or_is_refused(tmp_path: Path, case: str) -> None:
    state, expected = REUSED[case]
    path = write_archive(tmp_path / "x.bin", dumps(state), [("data/0", F32)])
    got = outcome(path)
    if isinstance(expected, str):
        assert isinstance(got, CorruptFileError) and expected in str(got), got
    else:
        assert got == expected
    torch = installed_torch()
    if torch is not None:
        theirs = torch_read(torch, path)
        assert isinstance(theirs, Exception) if isinstance(expected, str) else theirs == expected


# -- bytes from outside a tensor's own member -------------------------------------------------


def _two_storages(tmp_path: Path, numel_1: int = 4) -> Path:
    state = {"a": tensor("0", 4, (4,)), "b": tensor("1", numel_1, (numel_1,))}
    return write_archive(tmp_path / "x.bin", dumps(state), [("data/0", F32), ("data/1", F32)])


def _grown(tmp_path: Path) -> Path:
    """data/1 said 4 bytes longer than it is (its pickle agrees): they are version's local header."""
    path = _two_storages(tmp_path, numel_1=5)
    patch_central(path, "archive/data/1", size=20)
    return path


def _pointed_at_data_0(tmp_path: Path) -> Path:
    """data/1's central entry points at data/0's local header."""
    path = _two_storages(tmp_path)
    with zipfile.ZipFile(path) as archive:
        patch_central(path, "archive/data/1", offset=archive.getinfo("archive/data/0").header_offset)
    return path


def _past_the_end(tmp_path: Path) -> Path:
    path = _two_storages(tmp_path)
    patch_central(path, "archive/data/1", offset=path.stat().st_size + 100)
    return path


def _into_the_directory(tmp_path: Path) -> Path:
    path = _two_storages(tmp_path)
    patch_central(path, "archive/version", size=200)
    return path


OUTSIDE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "offset-past-the-storage": (
        lambda tmp: write_archive(tmp / "x.bin", dumps({"a": tensor("0", 4, (4,), offset=1)}), [("data/0", F32)]),
        r"tensor 'a' runs past the end of its storage",
    ),
    "storage-missing": (
        lambda tmp: write_archive(tmp / "x.bin", dumps({"a": tensor("7", 4, (4,))}), [("data/0", F32)]),
        r"storage '7' of tensor 'a' is missing from the archive",
    ),
    "member-grown-into-the-next": (_grown, r"member archive/data/1 overlaps member archive/version"),
    "member-pointed-at-another": (_pointed_at_data_0, r"member archive/data/1 has a damaged local header"),
    "member-grown-into-the-directory": (_into_the_directory, r"member archive/version overlaps the central directory"),
    "member-past-the-end": (_past_the_end, r"member archive/data/1 lies outside the archive"),
}


@pytest.mark.parametrize("case", list(OUTSIDE))
def test_a_tensor_never_reads_bytes_outside_its_own_member(tmp_path: Path, case: str) -> None:
    build, message = OUTSIDE[case]
    path = build(tmp_path)
    with pytest.raises(CorruptFileError, match=message):
        read(path)


def test_names_read_from_the_file_cannot_break_the_message_line(tmp_path: Path) -> None:
    """A member named with a newline, a global with a terminal escape: shown as their repr, the
    error stays one line and prints no control character."""
    members = [("data/0", F32), ("x\nerror: forged", b"")]
    path = write_archive(tmp_path / "x.bin", dumps({"a": tensor("0", 4, (4,))}), members)
    patch_central(path, "archive/data/0", size=17)
    with pytest.raises(CorruptFileError, match=r"overlaps member 'archive/x\\nerror: forged'") as info:
        read(path)
    assert "\n" not in str(info.value)
    path = write_archive(tmp_path / "y.bin", b"\x80\x02cos\x1b[2K\nsystem\n.", [("data/0", F32)])
    with pytest.raises(UnsafePickleError, match=r"asks for 'os\\x1b\[2K\.system'") as info:
        read(path)
    assert str(info.value).isprintable()


# -- byteorder --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (b"big", InputError, r"holds big-endian tensors; re-save it on a little-endian machine"),
        (b"middle", CorruptFileError, r"its byteorder record says b'middle', neither 'little' nor 'big'"),
        (b"little\n", CorruptFileError, r"says b'little\\n', neither"),  # torch.load refuses it too
        (b"\x00" * 100_000, CorruptFileError, r"its byteorder record is 100000 bytes, too long"),
    ],
)
def test_a_byteorder_other_than_little_is_named_as_it_is(
    tmp_path: Path, value: bytes, error: type[Exception], message: str
) -> None:
    path = write_archive(tmp_path / "x.bin", dumps({"a": tensor("0", 4, (4,))}), [("data/0", F32)], byteorder=value)
    with pytest.raises(error, match=message) as info:
        read(path)
    assert "\n" not in str(info.value)
    assert read(write_archive(tmp_path / "y.bin", dumps({"a": tensor("0", 4, (4,))}), [("data/0", F32)])) == {
        "a": ("F32", (4,), F32)
    }


RECORDS: dict[str, tuple[bytes | None, list[tuple[str, bytes]], str | None]] = {
    "no-version": (None, [], r"has no version record"),
    "version-not-a-number": (b"v3", [], r"its version record says b'v3', not a number"),
    "version-too-new": (
        b"11\n",
        [],
        r"its archive format version is 11; ramstream, like torch\.load, reads versions 1 to 10",
    ),
    "version-zero": (b"0", [], r"its archive format version is 0"),
    "version-too-long": (b"3" + b" " * 80, [], r"its version record is 81 bytes, too long"),
    "version-with-spaces": (b" 3 \n", [], None),
    "alignment-not-a-number": (b"3\n", [(".storage_alignment", b"sixty-four")], r"\.storage_alignment record says"),
    "alignment-empty": (b"3\n", [(".storage_alignment", b"")], r"\.storage_alignment record says b''"),
    "alignment": (b"3\n", [(".storage_alignment", b"64")], None),
    "serialization-id-not-text": (b"3\n", [(".data/serialization_id", b"\xb1" * 40)], r"serialization_id record says"),
}


@pytest.mark.parametrize("case", list(RECORDS))
def test_the_small_records_are_checked_as_torch_load_checks_them(tmp_path: Path, case: str) -> None:
    version, records, message = RECORDS[case]
    state = dumps({"a": tensor("0", 4, (4,))})
    path = write_archive(tmp_path / "x.bin", state, [("data/0", F32), *records], version=version)
    got = outcome(path)
    if message is None:
        assert got == {"a": ("F32", (4,), F32)}
    else:
        assert isinstance(got, InputError) and re.search(message, str(got)), got
    torch = installed_torch()
    if torch is not None and case != "version-too-long":  # torch reads a version of any length
        assert isinstance(torch_read(torch, path), Exception) == (message is not None)


@pytest.mark.parametrize("record", ["byteorder", "version"])
def test_an_encrypted_record_is_refused_by_name(tmp_path: Path, record: str) -> None:
    path = write_archive(tmp_path / "x.bin", dumps({"a": tensor("0", 4, (4,))}), [("data/0", F32)])
    patch_central(path, f"archive/{record}", flags=0x1)
    with pytest.raises(CorruptFileError, match=rf"x\.bin: its {record} record is encrypted"):
        read(path)


# -- the pickle -------------------------------------------------------------------------------

HOSTILE_PICKLES: dict[str, tuple[bytes, type[Exception], str]] = {
    "set-opcode": (b"\x80\x02\x8f.", CorruptFileError, r"opcode EMPTY_SET at byte 2, which torch.save's default"),
    "frame-opcode": (b"\x80\x04\x95" + struct.pack("<Q", 2**40) + b".", CorruptFileError, r"opcode FRAME at byte 2"),
    "memo-index-far-ahead": (b"\x80\x02}r\x00\x00\x00\x02.", CorruptFileError, r"memo index 33554432 at byte 3"),
    "length-beyond-the-pickle": (b"\x80\x02T\xff\xff\xff\x7fabc.", CorruptFileError, r"its pickle cannot be read"),
    "sets-the-state-of-a-storage-type": (
        b"\x80\x02ctorch\nFloatStorage\n(X\x04\x00\x00\x00BF16tb}.",
        CorruptFileError,
        r"sets the state of a torch object",
    ),
    "an-integer-beyond-64-bits": (  # 2**64, as the first of many keys with one hash
        b"\x80\x02}(\x8a\x09" + bytes(8) + b"\x01K\x00u.",
        CorruptFileError,
        r"an integer of 65 bits at byte 4, beyond 64",
    ),
    "a-foreign-global": (b"\x80\x02cos\nsystem\n.", UnsafePickleError, r"asks for os\.system.*may be malicious"),
}


@pytest.mark.parametrize("case", list(HOSTILE_PICKLES))
def test_a_pickle_torch_save_never_writes_is_refused_before_it_costs_anything(tmp_path: Path, case: str) -> None:
    raw, error, message = HOSTILE_PICKLES[case]
    path = write_archive(tmp_path / "x.bin", raw, [("data/0", F32)])
    with pytest.raises(error, match=message):
        read(path)
    # A later load is untouched (the stand-ins are shared by every load).
    good = write_archive(tmp_path / "y.bin", dumps({"a": tensor("0", 4, (4,))}), [("data/0", F32)])
    assert read(good) == {"a": ("F32", (4,), F32)}


@pytest.mark.parametrize("protocol", [1, 4, 5])
def test_a_pickle_protocol_torch_load_does_not_read_is_refused_by_name(tmp_path: Path, protocol: int) -> None:
    """torch.load(weights_only=True), its default since 2.6, reads what the default protocol 2 writes."""
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, tmp_path / "x.bin", pickle_protocol=protocol)
    with pytest.raises(CorruptFileError, match=r"x\.bin: its pickle cannot be read \(opcode \w+ at byte \d+, which"):
        read(tmp_path / "x.bin")
    assert isinstance(torch_read(torch, tmp_path / "x.bin"), Exception)


def test_a_compressed_or_oversized_pickle_is_refused_before_it_is_read(tmp_path: Path) -> None:
    pickled = dumps({"a": tensor("0", 4, (4,))})
    good = write_archive(tmp_path / "good.bin", pickled, [("data/0", F32)])
    deflated = rezip(tmp_path / "deflated.bin", members_of(good), compressed=["archive/data.pkl"])
    with pytest.raises(InputError, match=r"its pickle archive/data\.pkl is compressed or encrypted"):
        read(deflated)
    huge = write_archive(tmp_path / "huge.bin", bytes(MAX_PICKLE_BYTES + 1), [("data/0", F32)])
    with pytest.raises(CorruptFileError, match=rf"its pickle claims {MAX_PICKLE_BYTES + 1} bytes \(cap"):
        read(huge)


# Runs argv[1:] as its only child; prints that child's peak RSS in KiB (as tests/test_memory.py).
MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(done.returncode)\n"
)
READ_ONE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from ramstream.errors import RamstreamError
    from ramstream.format.checkpoint import read_weights_file
    try:
        print("read", len(read_weights_file(Path(sys.argv[1])).tensors))
    except RamstreamError as exc:
        print("refused", exc)
    """
)


def _peak_kib(path: Path) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, sys.executable, "-c", READ_ONE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said, peak = done.stdout.strip().rsplit("\n", 1)
    return int(peak), said


def _memo_bomb() -> bytes:  # memo table sized by a 5-byte claim: 512 MiB once filled (2**32: 64 GiB)
    return b"\x80\x02}r" + struct.pack("<I", 2**25) + b"."


def _length_claim() -> bytes:  # a 1 TiB bytes object claimed in 9 bytes (the C unpickler allocated it first)
    return b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b"x" * 64 + b"."


def _lists() -> bytes:  # 5 M empty lists, 5 MB that deflate to 5 KB: 400 MiB unpickled
    return b"\x80\x02](" + b"]" * 5_000_000 + b"e."


def _dicts() -> bytes:  # 300 KB of empty dicts: the most memory per byte that an allowed opcode builds
    return b"\x80\x02](" + b"}" * 300_000 + b"e."


@pytest.mark.parametrize(
    ("case", "build", "deflate"),
    [
        ("memo", _memo_bomb, False),
        ("length", _length_claim, False),
        ("deflated", _lists, True),
        ("dicts", _dicts, False),
    ],
)
def test_a_300_kb_file_costs_tens_of_mib_at_most(
    tmp_path: Path, case: str, build: Callable[[], bytes], deflate: bool
) -> None:
    """Peak RSS of a child reading a ~300 KB hostile file, against one reading a tiny good file."""
    good = write_archive(tmp_path / "good.bin", dumps({"a": tensor("0", 4, (4,))}), [("data/0", F32)])
    hostile = write_archive(tmp_path / "hostile.bin", build(), [("data/0", bytes(300_000))])
    if deflate:
        hostile = rezip(tmp_path / "deflated.bin", members_of(hostile), compressed=["archive/data.pkl"])
    assert 250_000 < hostile.stat().st_size < 700_000
    baseline, said = _peak_kib(good)
    assert said == "read 1"
    peak, said = _peak_kib(hostile)
    assert said.startswith(f"refused {hostile}: "), said
    assert peak - baseline < 40 * 1024, f"{case}: {peak - baseline} KiB above the baseline"


# -- ordinary content that ramstream does not read --------------------------------------------


def _torch_cases() -> dict[str, Callable[[object], dict[str, object]]]:
    return {
        "complex64": lambda t: {"w": t.zeros(2, dtype=t.complex64)},
        "complex128": lambda t: {"w": t.zeros(2, dtype=t.complex128)},
        "complex32": lambda t: {"w": t.zeros(2, dtype=t.complex32)},
        "float8_e4m3fnuz": lambda t: {"w": t.zeros(2, dtype=t.float8_e4m3fnuz)},
        "float8_e5m2fnuz": lambda t: {"w": t.zeros(2, dtype=t.float8_e5m2fnuz)},
        "float8_e8m0fnu": lambda t: {"w": t.zeros(2, dtype=t.float8_e8m0fnu)},
        "parameter-with-state": lambda t: {"w": _with_attribute(t.nn.Parameter(t.ones(2)))},
        "tensor-with-attribute": lambda t: {"w": _with_attribute(t.ones(2))},
        "quantized": lambda t: {"w": t.quantize_per_tensor(t.ones(2), 0.1, 0, t.qint8)},
        "sparse": lambda t: {"w": t.ones(2).to_sparse()},
        "meta": lambda t: {"w": t.ones(2, device="meta")},
    }


def _with_attribute(value: object) -> object:
    value.tp_split_dim = 0  # type: ignore[attr-defined]
    return value


@pytest.mark.parametrize("case", list(_torch_cases()))
def test_ordinary_torch_content_ramstream_does_not_read_is_named_not_called_malicious(
    tmp_path: Path, case: str
) -> None:
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is experimental, quantize_per_tensor deprecated
        torch.save(_torch_cases()[case](torch), tmp_path / "x.bin")
    with pytest.raises(InputError) as info:
        open_checkpoint(tmp_path / "x.bin")
    message = str(info.value)
    assert not isinstance(info.value, UnsafePickleError) and "malicious" not in message
    assert (
        message.startswith(f"{tmp_path / 'x.bin'}: ")
        and "'w'" in message
        and "which ramstream does not read" in message
    )
    if case.startswith(("complex", "float8")):
        assert isinstance(info.value, UnsupportedDtypeError) and f"dtype torch.{case}," in message
    expected = {
        "parameter-with-state": "a parameter saved with Python attributes",
        "tensor-with-attribute": "a tensor with Python attributes",
        "quantized": "a quantized tensor",
        "sparse": "a sparse tensor",
        "meta": "on the meta device",
    }
    assert expected.get(case, "dtype torch.") in message


@pytest.mark.parametrize(
    ("dtype", "name"),
    [("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"), ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")],
)
def test_dtypes_without_a_legacy_storage_are_read_where_torch_saved_them(tmp_path: Path, dtype: str, name: str) -> None:
    """torch.save writes them as an untyped storage and a dtype (_rebuild_tensor_v3), not a typed storage."""
    torch = pytest.importorskip("torch")
    values = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"m": values.to(getattr(torch, dtype)), "row": values.to(getattr(torch, dtype))[2]}
    torch.save(state, tmp_path / "x.bin")
    got = read(tmp_path / "x.bin")
    for key, value in state.items():
        assert got[key] == (name, tuple(value.shape), value.contiguous().view(torch.uint8).numpy().tobytes())


# -- a safetensors file named .bin / .pt ------------------------------------------------------


@pytest.mark.parametrize("name", ["model.bin", "model.pt", "dir/pytorch_model.bin", "header-starts-0x80.bin"])
def test_a_safetensors_file_named_like_torch_is_read_as_safetensors(tmp_path: Path, name: str) -> None:
    from safetensors.numpy import save_file

    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, dtype=np.float16)}
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    metadata = None
    if name.startswith("header"):  # a header length whose first byte is 0x80 once looked like a legacy pickle
        for pad in range(256):
            save_file(tensors, path, metadata={"pad": "x" * pad})
            if path.read_bytes()[0] == 0x80:
                break
        metadata = {"pad": "x" * pad}
        assert path.read_bytes()[0] == 0x80
    save_file(tensors, path, metadata=metadata)
    checkpoint = open_checkpoint(path.parent if name.startswith("dir") else path)
    assert checkpoint.files == (path,)
    got = read(path)
    assert got == {k: (("F32" if v.dtype == np.float32 else "F16"), v.shape, v.tobytes()) for k, v in tensors.items()}


# -- the legacy format's conversion command ----------------------------------------------------


def test_the_legacy_conversion_command_quotes_the_path(tmp_path: Path) -> None:
    """The command works when pasted into a shell, for a path with quotes and spaces."""
    torch = pytest.importorskip("torch")
    folder = tmp_path / 'it\'s a "model" $HOME'
    folder.mkdir()
    path = folder / "old 'one'.bin"
    torch.save({"w": torch.arange(3.0)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(InputError, match="legacy") as info:
        read(path)
    command = str(info.value).split("convert it with: ", 1)[1]
    assert command.startswith("python -c ")
    done = subprocess.run(
        ["bash", "-c", shlex.quote(sys.executable) + command[len("python") :]], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert read(path) == {"w": ("F32", (3,), np.arange(3, dtype=np.float32).tobytes())}


# -- on the command line ------------------------------------------------------------------------


def test_an_archive_that_lies_is_one_line_on_the_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    pickled = dumps({"w": tensor("0", 4, (4,))})
    write_archive(bad / "pytorch_model.bin", pickled, [("data/0", F32), ("data/0", F32_100[:16])])
    outcome = in_process("probe", bad, bad, "--cache-dir", tmp_path / "cache")
    one_line_error(outcome, "pytorch_model.bin", "two members named 'archive/data/0'")
