"""PyTorch ``.bin`` checkpoints (``torch.save``'s zip format), read in place without torch.

Files are written by ``torch.save`` itself; ramstream's reader must find every tensor's bytes
where torch put them, refuse what it cannot stream (a compressed member, a non-contiguous
tensor, the legacy format) by name, refuse a pickle that asks for anything but torch's tensor
rebuilding without running it, and merge a ``.bin`` family to the bytes of the same weights as
safetensors.
"""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ramstream.errors import CorruptFileError, InputError
from ramstream.format.checkpoint import open_checkpoint
from ramstream.format.torch_zip import UnsafePickleError
from tests.families import build_family, read_model_dir
from tests.test_cli import RUNNERS, in_process, ok, one_line_error

torch = pytest.importorskip("torch")

TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def stored_bytes(path: Path, name: str) -> bytes:
    """Tensor ``name`` of an opened checkpoint, read from the file at the offset ramstream found."""
    ref = open_checkpoint(path).tensors[name]
    with open(ref.file, "rb") as f:
        f.seek(ref.entry.offset)
        return f.read(ref.entry.nbytes)


def torch_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def as_torch(dtype: str, shape: tuple[int, ...], raw: np.ndarray) -> torch.Tensor:
    """A raw array as written by tests/families.py, as the torch tensor holding the same bits."""
    if dtype == "BF16":
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(raw.copy()).reshape(shape)


def save_as_bin(source: Path, target: Path, shards: int = 1) -> Path:
    """The safetensors model directory ``source`` re-saved with ``torch.save`` (sharded with a
    ``pytorch_model.bin.index.json`` when ``shards`` > 1), its other files copied."""
    target.mkdir(parents=True)
    for extra in source.iterdir():
        if not extra.name.startswith("model"):
            shutil.copy(extra, target / extra.name)
    tensors = {n: as_torch(*spec) for n, spec in read_model_dir(source).items()}
    if shards == 1:
        torch.save(tensors, target / "pytorch_model.bin")
        return target
    names = list(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin"
        torch.save({n: tensors[n] for n in names[k::shards]}, target / file)
        weight_map.update({n: file for n in names[k::shards]})
    (target / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return target


# -- reading ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_every_tensor_is_found_where_torch_saved_it(tmp_path: Path, dtype: str) -> None:
    gen = torch.Generator().manual_seed(1)
    tensors = {
        "embed.weight": torch.randn(33, 8, generator=gen).to(TORCH_DTYPES[dtype]),
        "norm.weight": torch.randn(8, generator=gen).to(TORCH_DTYPES[dtype]),
        "scalar": torch.tensor(3.5).to(TORCH_DTYPES[dtype]),
        "ids": torch.arange(5),
        "empty": torch.zeros(0, 4).to(TORCH_DTYPES[dtype]),
    }
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    checkpoint = open_checkpoint(tmp_path)
    assert list(checkpoint.tensors) == list(tensors)
    for name, tensor in tensors.items():
        entry = checkpoint.tensors[name].entry
        assert entry.shape == tuple(tensor.shape)
        assert entry.dtype == ("I64" if name == "ids" else dtype)
        assert stored_bytes(tmp_path, name) == torch_bytes(tensor), name


def test_tensors_sharing_a_storage_are_read_in_place(tmp_path: Path) -> None:
    """torch.save keeps shared storage shared: a row of a matrix, a tied head, a model's state dict."""
    weight = torch.randn(6, 4).to(torch.bfloat16)
    model = torch.nn.Linear(4, 6)
    state = {**model.state_dict(), "embed.weight": weight, "lm_head.weight": weight, "row": weight[3]}
    torch.save(state, tmp_path / "pytorch_model.bin")
    checkpoint = open_checkpoint(tmp_path)
    head, embed, row = (checkpoint.tensors[n].entry for n in ("lm_head.weight", "embed.weight", "row"))
    assert head.offset == embed.offset and row.offset == embed.offset + 3 * 4 * 2
    for name, tensor in state.items():
        assert stored_bytes(tmp_path, name) == torch_bytes(tensor), name


def test_a_non_contiguous_tensor_is_refused_by_name(tmp_path: Path) -> None:
    torch.save({"ok": torch.ones(3), "w.T": torch.randn(4, 6).t()}, tmp_path / "x.bin")
    with pytest.raises(InputError, match=r"x\.bin: tensor 'w\.T' is stored non-contiguous.*contiguous\(\)"):
        open_checkpoint(tmp_path / "x.bin")


def test_a_compressed_member_is_refused_by_name(tmp_path: Path) -> None:
    torch.save({"w": torch.randn(64, 64)}, tmp_path / "saved.bin")
    with zipfile.ZipFile(tmp_path / "saved.bin") as src, zipfile.ZipFile(tmp_path / "x.bin", "w") as dst:
        for info in src.infolist():
            packed = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            dst.writestr(info.filename, src.read(info), compress_type=packed)
    with pytest.raises(InputError, match=r"x\.bin: storage member .*/data/0 is compressed"):
        open_checkpoint(tmp_path / "x.bin")


def test_the_legacy_format_is_refused_with_the_command_to_convert(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(InputError, match=r"old\.bin: .*legacy.*torch\.save\(torch\.load\("):
        open_checkpoint(tmp_path / "old.bin")


class _Payload:
    """Pickles as a call of ``func(arg)``: what a hostile checkpoint would carry."""

    def __init__(self, func: object, arg: str) -> None:
        self.func, self.arg = func, arg

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return self.func, (self.arg,)


def hostile_checkpoint(path: Path, payload: object) -> Path:
    """A zip laid out like torch.save's whose pickle calls ``payload`` on load."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"w": payload}, protocol=2))
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return path


@pytest.mark.parametrize("call", ["os.system", "builtins.eval"])
def test_a_pickle_asking_for_anything_else_is_refused_and_nothing_runs(tmp_path: Path, call: str) -> None:
    import builtins
    import os

    marker = tmp_path / "ran"
    func, arg = {
        "os.system": (os.system, f"touch {marker}"),
        "builtins.eval": (builtins.eval, f"open({str(marker)!r}, 'w')"),
    }[call]
    path = hostile_checkpoint(tmp_path / "pytorch_model.bin", _Payload(func, arg))
    with pytest.raises(UnsafePickleError) as info:
        open_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert f".{call.split('.')[1]}," in message  # posix.system / __builtin__.eval: the global as pickled
    assert not marker.exists()


def test_a_malformed_escape_in_a_pickled_name_is_a_corrupt_file(tmp_path: Path) -> None:
    """pickletools decodes GLOBAL's names with escape_decode, which only warns on ``\\ ``: the
    file is damaged, and said so in one line (the fuzzer found this one)."""
    path = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02ctorch._utils\\ x\n_rebuild_tensor_v2\n.")
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    with pytest.raises(CorruptFileError) as info:
        open_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and "malformed" in message


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_hostile_checkpoint_is_one_line_on_the_command_line(tmp_path: Path, runner: str) -> None:
    import os

    fam = build_family(tmp_path / "fam", densities=(0.1,))
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    hostile_checkpoint(hostile / "pytorch_model.bin", _Payload(os.system, f"touch {marker}"))
    outcome = RUNNERS[runner]("merge", fam.base, hostile, "--out", tmp_path / "out", "--quiet")
    one_line_error(outcome, "pytorch_model.bin", "system", "refused without running anything")
    assert not marker.exists()


def test_garbage_inside_the_zip_is_a_corrupt_file(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "x.bin", "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02garbage")
    with pytest.raises(CorruptFileError, match=r"x\.bin: its pickle cannot be read"):
        open_checkpoint(tmp_path / "x.bin")
    (tmp_path / "y.bin").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CorruptFileError, match=r"y\.bin: not a valid PyTorch zip checkpoint"):
        open_checkpoint(tmp_path / "y.bin")
    torch.save({"w": torch.ones(2), "step": 3}, tmp_path / "z.bin")
    with pytest.raises(InputError, match=r"z\.bin: entry 'step' is not a tensor"):
        open_checkpoint(tmp_path / "z.bin")


def test_a_directory_with_both_formats_is_read_as_safetensors(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1,))
    torch.save({"other": torch.ones(2)}, fam.base / "pytorch_model.bin")
    assert open_checkpoint(fam.base).files == (fam.base / "model.safetensors",)


# -- merging ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("shards", "method"), [(1, "ram+"), (2, "ties"), (1, "task_arithmetic")])
def test_merging_bin_checkpoints_gives_the_bytes_of_the_same_weights_as_safetensors(
    tmp_path: Path, shards: int, method: str
) -> None:
    fam = build_family(tmp_path / "st", int_tensor=True)
    as_bin = [save_as_bin(p, tmp_path / "bin" / p.name, shards) for p in [fam.base, *fam.agents]]
    assert open_checkpoint(as_bin[0]).files[0].suffix == ".bin"
    common = ["--method", method, "--cache-dir", str(tmp_path / "cache"), "--memory", "16MiB", "--quiet"]
    common += ["--density", "0.3"] if method == "ties" else []
    ok(in_process("merge", fam.base, *fam.agents, "--out", tmp_path / "out-st", *common))
    ok(in_process("merge", *as_bin, "--out", tmp_path / "out-bin", *common))
    expected, got = read_model_dir(tmp_path / "out-st"), read_model_dir(tmp_path / "out-bin")
    assert set(got) == set(expected)  # in the base's order, which its shards set
    for name, (dtype, shape, raw) in expected.items():
        assert got[name][:2] == (dtype, shape) and got[name][2].tobytes() == raw.tobytes(), name
    record = json.loads((tmp_path / "out-bin" / "ramstream_merge.json").read_text())
    assert {f["file"] for f in record["inputs"][0]["files"]} == {
        p.name for p in as_bin[0].iterdir() if p.suffix == ".bin"
    }
