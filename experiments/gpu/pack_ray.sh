#!/usr/bin/env bash
# Pack Ray and its dependencies for a machine without network whose carry limit (64 MiB) the
# 79 MB wheel alone exceeds: the wheels for that machine's Python unpacked, the Ray libraries
# a bench sweep does not use removed (Java jars, RLlib, Data, Serve, Tune, Train, LLM, the
# dashboard's web client), the shared objects and the raylet / GCS binaries stripped of symbols,
# all in one xz archive (about 19 MB for Ray 2.60.0, cp312; 108 MB unpacked).
# experiments/gpu/setup.sh unpacks it on the GPU machine.
# Usage: bash experiments/gpu/pack_ray.sh OUT.tar.xz [PYTHON_VERSION]   (default 3.12)
set -eu
out=$(realpath "$1"); py=${2:-3.12}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m pip download -q "ray==2.60.0" --python-version "$py" --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$work/wheels"
mkdir "$work/site"
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site/"; done
rm -rf "$work"/site/ray/{jars,rllib,data,serve,tune,train,llm,dashboard/client/build}
# zipfile drops the executable bits: the raylet and GCS server are started as programs
find "$work/site" -type f \( -path "*/ray/core/src/*" -o -name "*.so" \) -exec chmod +x {} +
find "$work/site" -type f \( -path "*/ray/core/src/*" -o -name "*.so" \) -size +1M \
    -exec strip --strip-unneeded {} +
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
tar cf - -C "$work/site" . | xz -9 -T2 > "$out"
ls -la "$out"
