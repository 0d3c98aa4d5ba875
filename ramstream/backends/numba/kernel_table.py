"""The Numba kernels each method's merge calls, in the order it first calls them, with their
argument types (``str`` of Numba's types; ``w`` and ``workers`` last): what ``prewarm`` hands to
child processes to compile. Written by ``tools/record_kernels.py``; do not edit by hand.
"""

# fmt: off
KERNELS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    'ram+': [
        ('probe', '_probe_part', ('array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'float64', 'array(uint8, 1d, C)', 'int64', 'array(int64, 3d, C)', 'array(int64, 2d, C)', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('merge_ram', '_merge_ram_part', ('array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'float64', 'array(float32, 2d, C)', 'array(int64, 1d, C)', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'task_arithmetic': [
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'linear': [
        ('linear', '_merge_linear_part', ('int64', 'int64', 'int64', 'float32', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'bool', 'int64', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'ties': [
        ('magnitude', '_high_histogram_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(int32, 3d, C)', 'int64', 'int64')),
        ('magnitude', '_low_histogram_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(int32, 2d, C)', 'array(int32, 4d, C)', 'int64', 'int64')),
        ('magnitude', '_tie_count_part', ('int64', 'int64', 'int64', 'int64', 'int64', 'uint32', 'int64', 'int64', 'int64')),
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'breadcrumbs': [
        ('magnitude', '_low_histogram_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(int32, 2d, C)', 'array(int32, 4d, C)', 'int64', 'int64')),
        ('magnitude', '_tie_count_part', ('int64', 'int64', 'int64', 'int64', 'int64', 'uint32', 'int64', 'int64', 'int64')),
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'dare_ties': [
        ('exact_stats', '_abs_sums_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'bool', 'array(int64, 4d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'della': [
        ('della', '_della_keep_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64', 'array(uint64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'bool', 'array(float32, 2d, C)', 'int64', 'int64')),
        ('exact_stats', '_abs_sums_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(float32, 2d, C)', 'bool', 'array(int64, 4d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('della', '_della_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64', 'array(uint64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'bool', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'model_stock': [
        ('exact_stats', '_gram_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'bool', 'array(int64, 3d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'sce': [
        ('exact_stats', '_abs_sums_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'int64', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'bool', 'array(int64, 4d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('sce', '_merge_sce_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(uint32, 1d, C)', 'array(int64, 2d, C)', 'int64', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'multislerp': [
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'nuslerp': [
        ('exact_stats', '_gram_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'bool', 'array(int64, 3d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('gta', '_gta_merge_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint8, 2d, C)', 'array(uint64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'array(uint32, 2d, C)', 'array(int64, 3d, C)', 'int64', 'bool', 'array(float32, 1d, C)', 'array(int64, 1d, C)', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'slerp': [
        ('exact_stats', '_gram_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'bool', 'array(int64, 3d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('linear', '_merge_linear_part', ('int64', 'int64', 'int64', 'float32', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'bool', 'int64', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'karcher': [
        ('exact_stats', '_gram_block_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'bool', 'array(int64, 3d, C)', 'array(int64, 1d, C)', 'int64', 'int64')),
        ('linear', '_merge_linear_part', ('int64', 'int64', 'int64', 'float32', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'bool', 'int64', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'nearswap': [
        ('nearswap', '_merge_nearswap_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'float32', 'int64', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
    'arcee_fusion': [
        ('fusion', '_importance_histograms_part', ('int64', 'int64', 'int64', 'int64', 'int64', 'array(float32, 1d, C)', 'int64', 'int64', 'array(int32, 1d, C)', 'array(int32, 2d, C)', 'array(int32, 3d, C)', 'int64', 'int64')),
        ('fusion', '_merge_fusion_part', ('int64', 'int64', 'int64', 'array(int64, 1d, C)', 'array(int64, 1d, C)', 'array(float32, 1d, C)', 'int64', 'int64', 'float32', 'int64', 'int64', 'int64', 'int64')),
        ('nonfinite', '_count_exponent_part', ('array(uint16, 1d, C)', 'uint16', 'int64', 'int64')),
    ],
}

# Kernels that decode a block's inputs (an FP8 base's), called before any method's kernel.
INPUT_KERNELS: list[tuple[str, str, tuple[str, ...]]] = [
    ('quantized', '_dequantize_part', ('int64', 'int64', 'array(float32, 1d, C)', 'array(float32, 1d, C)', 'int64', 'int64', 'int64', 'int64', 'int64', 'int64', 'int64', 'int64', 'int64')),
]
# fmt: on
