"""Refuse a merged block that holds NaN/Inf its inputs did not have.

Inputs with NaN/Inf are refused (unless ``--allow-nonfinite``), so outputs must be too: a merged
value can pass the output format's range (65504 for f16) or overflow float32 (a huge λ or weight)
and would be written as Inf, with exit 0. ``check_block`` runs on every merged block right after
it is computed: one scan of the raw output by the backend, no copy; only a block that fails it is
looked at closely (decoded, compared with its inputs, merged again in float32 for the message).
"""

from __future__ import annotations

import numpy as np

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.errors import NonFiniteOutputError, TaskVectorOverflowError
from ramstream.format import codecs
from ramstream.format.dtypes import FloatCode
from ramstream.methods.base import BlockMerger
from ramstream.plan import Block

_RANGE: dict[int, str] = {
    FloatCode.BF16: "bf16",
    FloatCode.F16: "f16 (largest 65504)",
    FloatCode.F32: "f32",
    FloatCode.F64: "f64",
}

# Where a value that is finite in float32 overflowed the output format: the formats that hold it
# (never the one that was just written, whatever --out-dtype said).
_WIDER: dict[int, str] = {
    FloatCode.BF16: "--out-dtype f32",  # bf16 rounds up to Inf just below float32's largest
    FloatCode.F16: "--out-dtype f32 (or bf16)",
}


def check_block(
    out: np.ndarray,
    out_code: int,
    arrays: BlockArrays,
    block: Block,
    tensor: str,
    inputs_finite: bool,
    merge_block: BlockMerger,
    backend: Backend,
    task_vectors: bool = True,
) -> None:
    """Raise ``NonFiniteOutputError`` when ``out``, the block ``merge_block`` just merged, holds
    NaN/Inf where every input is finite; ``TaskVectorOverflowError`` when the method merges task
    vectors (``task_vectors``) and one of them overflows float32 there (finite weights too far apart).

    ``inputs_finite``: the inputs were checked (no NaN/Inf anywhere), so any NaN/Inf is new;
    otherwise (``--allow-nonfinite``, or the probe checked them) only positions whose inputs are
    all finite count.
    """
    if not out.size or not backend.has_nonfinite(out, out_code):
        return
    bad = np.flatnonzero(~np.isfinite(codecs.decode(out, out_code)))
    if not inputs_finite:
        bad = bad[_inputs_finite_at(arrays, bad)]
    if not bad.size:
        return
    if task_vectors:
        error = arrays.nonfinite_error(int(bad[0]))
        if isinstance(error, TaskVectorOverflowError):
            raise error
    merged = np.empty(out.size, np.float32)  # merged again in float32, for the largest value
    merge_block(arrays, block, merged, int(FloatCode.F32), backend)
    raise NonFiniteOutputError(_message(tensor, block.start + int(bad[0]), merged, out_code))


def _inputs_finite_at(arrays: BlockArrays, positions: np.ndarray) -> np.ndarray:
    """For each position, True when the base and every agent are finite there."""
    finite = np.isfinite(codecs.decode(arrays.base[positions], arrays.base_code))
    for agent, code in zip(arrays.agents, arrays.agent_codes, strict=True):
        finite &= np.isfinite(codecs.decode(agent[positions], int(code)))
    return finite


def _message(tensor: str, element: int, merged: np.ndarray, out_code: int) -> str:
    finite = merged[np.isfinite(merged)]
    largest = float(np.abs(finite).max()) if finite.size else 0.0
    if np.isfinite(merged).all():
        why = f"its largest merged value, {largest:.6g}, is beyond the range of {_RANGE[out_code]}"
        fix = f"write {_WIDER.get(out_code, 'another --out-dtype')}, or lower the method's weights or lambda"
    else:
        why = f"the merge overflows float32 (its largest finite merged value is {largest:.6g})"
        fix = "lower the method's weights, lambda or r"
    return (
        f"tensor {tensor!r}: the merge would write NaN/Inf (first at element {element}) where every input is "
        f"finite: {why}; {fix}"
    )
