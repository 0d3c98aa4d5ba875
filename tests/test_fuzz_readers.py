"""Property-based fuzz of the ``.bin`` reader and the safetensors header parser over mutations of
real files (``tests/reader_fuzz.py``): the right tensors or a clean refusal, within a memory
budget. A bounded number of examples here; ``tools/fuzz_readers.py --examples N`` runs longer.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream.errors import CorruptFileError
from tests.reader_fuzz import (
    Seed,
    apply,
    apply_to_members,
    bin_seed,
    byte_edits,
    member_edits,
    outcome,
    read,
    safetensors_reference,
    safetensors_seed,
    torch_reference,
)

FUZZ = settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def torch() -> ModuleType:
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bin_file(torch: ModuleType) -> Seed:
    return bin_seed(torch)


SAFETENSORS = safetensors_seed()


def test_the_seeds_read_as_saved(tmp_path: Path, torch: ModuleType, bin_file: Seed) -> None:
    for seed, reference in ((bin_file, torch_reference(torch)), (SAFETENSORS, safetensors_reference)):
        (tmp_path / seed.name).write_bytes(seed.data)
        assert read(tmp_path / seed.name) == seed.tensors == reference(tmp_path / seed.name)


@FUZZ
@given(data=st.data())
def test_fuzz_bin_bytes(tmp_path: Path, torch: ModuleType, bin_file: Seed, data: st.DataObject) -> None:
    edits = data.draw(byte_edits(len(bin_file.data), bin_file.hot))
    path = tmp_path / bin_file.name
    path.write_bytes(apply(bin_file.data, edits))
    outcome(path, bin_file, torch_reference(torch))


@FUZZ
@given(edits=member_edits())
def test_fuzz_bin_members(tmp_path: Path, torch: ModuleType, bin_file: Seed, edits: list[tuple[object, ...]]) -> None:
    path = apply_to_members(bin_file, edits, tmp_path / bin_file.name)
    outcome(path, bin_file, torch_reference(torch))


@FUZZ
@given(edits=byte_edits(len(SAFETENSORS.data), SAFETENSORS.hot))
def test_fuzz_safetensors_bytes(tmp_path: Path, edits: list[tuple[object, ...]]) -> None:
    path = tmp_path / SAFETENSORS.name
    path.write_bytes(apply(SAFETENSORS.data, edits))
    outcome(path, SAFETENSORS, safetensors_reference)


# -- what the fuzz found ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F16", "shape": [2], '
         '"data_offsets": [0, 4]}}', "'w'"),
        ('{"w": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}', "'dtype'"),
        ('{"__metadata__": {}, "__metadata__": {"a": "b"}, "w": {"dtype": "F32", "shape": [1], '
         '"data_offsets": [0, 4]}}', "'__metadata__'"),
    ],
)  # fmt: skip
def test_a_safetensors_header_naming_a_key_twice_is_refused(tmp_path: Path, header: str, key: str) -> None:
    """json keeps the last of two equal keys, other readers the first or neither."""
    path = tmp_path / "x.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(4))
    with pytest.raises(CorruptFileError, match=rf"x\.safetensors: header holds the key {key} twice"):
        read(path)


@pytest.mark.parametrize("dtype", ["[]", '{"F32": 1}'])
def test_a_safetensors_dtype_that_is_a_list_or_an_object_is_refused(tmp_path: Path, dtype: str) -> None:
    """It is unhashable: looked up among the dtypes, it raised TypeError."""
    header = f'{{"w": {{"dtype": {dtype}, "shape": [1], "data_offsets": [0, 4]}}}}'
    path = tmp_path / "x.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(4))
    with pytest.raises(CorruptFileError, match=r"x\.safetensors: tensor 'w' has unknown dtype"):
        read(path)
