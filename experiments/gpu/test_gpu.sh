#!/usr/bin/env bash
# On the GPU machine: run the tests marked `gpu` (CI on the CPU runs `-m "not gpu"`). The Julia
# tests are left out: they need tree_sitter, which the GPU image lacks, and none is marked gpu.
# Usage: bash experiments/gpu/test_gpu.sh [$OUT/gpu_tests.log]
set -u
. experiments/gpu/setup.sh
python3 -m pytest -q -m gpu tests -p no:cacheprovider --ignore-glob='tests/test_julia*' 2>&1 \
    | tee "${1:-/dev/null}" | tail -5
