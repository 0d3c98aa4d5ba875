#!/usr/bin/env bash
# The GPU runbook: a lent GPU machine has no package registry, and its image (Python 3.12 with a
# CUDA build of torch, numpy, numba, safetensors, click, pytest, hypothesis) lacks zarr and what
# zarr needs. Two steps, so the GPU's minutes go to running, not installing:
#
#   tools/gpu_check.sh wheels shared/wheels
#       here, with a registry: download wheels of what the image lacks (CPython 3.12, manylinux,
#       x86-64) into shared/wheels, which travels with the working tree;
#   tools/gpu_check.sh run shared/wheels LOGS [BENCH_DATA]
#       on the GPU machine: install those wheels into LOGS/site (never into the image), put them
#       and this checkout on PYTHONPATH, then write to LOGS: device.txt (the GPU, torch, CUDA),
#       tests.log (every torch test, the CUDA ones no longer skipped) and, given BENCH_DATA (a
#       directory on the machine's disk, the family written there once), bench.log
#       (tools/bench_torch.py --cuda) and host.log (its --host: the streamed path's host side
#       alone). Each step's exit status lands in LOGS/status.txt; the
#       script exits non-zero when any step failed.
#   tools/gpu_check.sh bench shared/wheels LOGS BENCH_DATA
#       the same install and device.txt, then only the benchmark (bench.log; it compares every
#       torch output with Numba's byte for byte), for a short lease: 8 minutes is its aim, the
#       6 GB family written first included (BENCH_METHODS=ram+,ties,... runs fewer merges).
set -u

# What the image lacks (docs/torch.md, "On a lent GPU machine"): zarr and its dependencies, at the
# versions `make install` resolves here (zarr from 3.2 needs msgspec too, and is untested here).
MISSING=(zarr==3.1.6 numcodecs==0.16.6 donfig crc32c google-crc32c typing_extensions packaging pyyaml)

usage() {
    sed -n '2,20p' "$0" >&2
    exit 2
}

[ $# -ge 2 ] || usage
repo=$(cd "$(dirname "$0")/.." && pwd)

case "$1" in
wheels)
    dir=$2
    mkdir -p "$dir"
    # wheels for the image's interpreter (pure-Python ones, or CPython 3.12 manylinux x86-64)
    python3 -m pip download --dest "$dir" --only-binary=:all: --no-deps \
        --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${MISSING[@]}"
    ;;
run | bench)
    [ $# -ge 3 ] || usage
    mode=$1
    wheels=$2
    logs=$(mkdir -p "$3" && cd "$3" && pwd)
    data=${4:-}
    [ "$mode" = run ] || [ -n "$data" ] || usage
    python=${PYTHON:-python3}
    site="$logs/site"
    status="$logs/status.txt"
    : >"$status"
    failed=0
    step() { # step NAME LOG COMMAND...: run it, record its exit status
        local name=$1 log=$2
        shift 2
        "$@" >"$log" 2>&1
        local rc=$?
        echo "$name $rc" >>"$status"
        [ $rc -eq 0 ] || failed=1
    }
    step install "$logs/install.log" "$python" -m pip install --no-index --find-links "$wheels" \
        --target "$site" --no-deps "${MISSING[@]}"
    export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"
    export NUMBA_CACHE_DIR="$logs/numba-cache"
    cd "$repo" || exit 1
    step device "$logs/device.txt" "$python" -c "
import torch
import numba, numpy
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = None
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(),
      'triton', triton_version, 'numba', numba.__version__, 'numpy', numpy.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(0), p.total_memory // 2**20, 'MiB', p.multi_processor_count, 'SMs')
"
    if [ "$mode" = run ]; then
        step tests "$logs/tests.log" "$python" -m pytest -q -rs -p no:cacheprovider \
            tests/test_torch_backend.py tests/test_torch_streamed.py tests/test_cuda_streams.py tests/test_backends.py \
            tests/test_fused_kernels.py
    fi
    if [ -n "$data" ]; then
        step bench "$logs/bench.log" "$python" tools/bench_torch.py --cuda --data "$data" \
            ${BENCH_METHODS:+--methods "$BENCH_METHODS"}
        step host "$logs/host.log" "$python" tools/bench_torch.py --host --data "$data" --repeat 2
    fi
    cat "$status"
    exit $failed
    ;;
*)
    usage
    ;;
esac
