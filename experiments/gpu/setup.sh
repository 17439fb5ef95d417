# Source this on the GPU machine: installs the carried wheels (.whl/) that the image lacks and
# puts the repository on the Python path. The image's python3 has torch, numpy and onnx.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
alias autotm="python3 -m autotm_py"
