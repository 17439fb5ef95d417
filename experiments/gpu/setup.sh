# Source this on the GPU machine: makes the carried Python packages that the image lacks
# importable and puts the repository on the Python path. The image's python3 has torch, numpy
# and onnx. What may be carried (git-ignored; `run`'s carry list):
#   .whl/     wheels (pulp, highspy), installed into /tmp/site
#   .devsite/ the same already installed (`pip install --target .devsite pulp highspy` for the
#             GPU machine's Python, e.g. `--python-version 3.12 --only-binary=:all:`)
#   .devray/ray312.tar.xz  Ray and its dependencies, trimmed (experiments/gpu/pack_ray.sh): the
#             wheel alone is over the carry limit; unpacked into /tmp/raysite, last on the path
#             so that the image's own packages win
site=/tmp/site
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || return 1
fi
[ -d .devsite ] && site="$site:$PWD/.devsite"
if [ -f .devray/ray312.tar.xz ]; then
  mkdir -p /tmp/raysite && tar xJf .devray/ray312.tar.xz -C /tmp/raysite || return 1
  site="$site:/tmp/raysite"
fi
export PYTHONPATH="$PWD:$site" PYTHONUNBUFFERED=1
alias autotm="python3 -m autotm_py"
