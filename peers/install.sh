#!/usr/bin/env bash
# The real peers that perfkit's peer tests and benchmarks run against, installed into DIR
# (default ~/.cache/perfkit-peers):
#   DIR/bin/perf_analyzer  NVIDIA perf_analyzer 2.48.0 (C++), from the tritonclient 2.48.0 wheel
#   DIR/bin/tritonserver   NVIDIA Triton Inference Server 2.51, from the nvidia-pytriton 0.7.0 wheel,
#                          with its python backend in DIR/backends (--backend-directory DIR/backends)
#   DIR/bin/aiperf         NVIDIA AIPerf 0.13.0 (generative endpoints), from PyPI into a virtual
#                          environment of its own, DIR/aiperf: its requirements conflict with perfkit's
#   DIR/bin/mlserver       Seldon MLServer 1.7.1, from PyPI into DIR/mlserver (about 330 MB)
#   DIR/bin/kserve-python  the python of DIR/kserve, where KServe 0.21.0 (its python ModelServer) is
#                          installed from PyPI (about 450 MB); run a model file with it
# MLServer and KServe are Open Inference Protocol servers without Triton's extensions; each has a
# virtual environment of its own, since their pinned requirements conflict with perfkit's and each other's.
# All run on a machine without a GPU. Usage: bash peers/install.sh [DIR], then PERFKIT_PEERS=DIR.
# Needs pip, apt-get (as root or through sudo), the network and about 2.4 GB of disk (1.2 GB AIPerf's).
# Idempotent: once DIR holds working peers, a run only checks them and says so.
set -euo pipefail

DIR=$(realpath -m "${1:-$HOME/.cache/perfkit-peers}")
PY=${PYTHON:-python3}
# The python backend's stub runs models under Debian's python3.11, which takes third-party modules
# from this folder only: PYTHONPATH does not reach it.
MODEL_SITE=/usr/local/lib/python3.11/dist-packages
# Wheels for the stub's CPython 3.11 on x86-64 Linux, whatever Python runs pip here.
CP311=(--only-binary=:all: --python-version 3.11 --implementation cp
    --platform manylinux1_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux_2_28_x86_64 --platform manylinux_2_35_x86_64)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

model_packages_ready() {
    [ -d "$MODEL_SITE/numpy" ] && [ -d "$MODEL_SITE/onnxruntime" ]
}

ready() {
    [ -x "$DIR/bin/tritonserver" ] && [ -x "$DIR/backends/python/triton_python_backend_stub" ] \
        && model_packages_ready && "$DIR/bin/perf_analyzer" --version >/dev/null 2>&1
}

# extract WHEEL DEST PREFIX...: the wheel's members under any PREFIX, without needing unzip.
extract() {
    "$PY" - "$@" <<'EOF'
import sys
import zipfile

wheel, dest, *prefixes = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(dest, [name for name in archive.namelist() if name.startswith(tuple(prefixes))])
EOF
}

# wrapper NAME LIBDIR [VAR=VALUE]: DIR/bin/NAME runs DIR/libexec/NAME with LIBDIR on the library path.
wrapper() {
    local name=$1 libdir=$2 env=${3:-}
    cat >"$DIR/bin/$name" <<EOF
#!/bin/sh
${env:+$env }LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DIR/libexec/$name" "\$@"
EOF
    chmod +x "$DIR/bin/$name"
}

AIPERF_VERSION=0.13.0
aiperf_ready() {
    [[ "$("$DIR/bin/aiperf" --version 2>/dev/null)" == *"$AIPERF_VERSION"* ]]
}

# AIPerf first, on its own: a rerun that finds it installs nothing, whatever the state of the rest.
if ! aiperf_ready; then
    mkdir -p "$DIR/bin"
    rm -rf "$DIR/aiperf"
    "$PY" -m venv "$DIR/aiperf"
    "$DIR/aiperf/bin/pip" install -q "aiperf==$AIPERF_VERSION"
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$DIR/aiperf/bin/aiperf" >"$DIR/bin/aiperf"
    chmod +x "$DIR/bin/aiperf"
    aiperf_ready || { echo "AIPerf in $DIR/aiperf does not run: $DIR/bin/aiperf --version fails" >&2; exit 1; }
fi

# venv_peer NAME REQUIREMENT VERSION_COMMAND...: REQUIREMENT (name==version) in a virtual environment
# of its own, DIR/NAME, unless VERSION_COMMAND already prints its version there.
venv_peer() {
    local name=$1 requirement=$2
    shift 2
    [[ "$("$@" 2>/dev/null)" == *"${requirement#*==}"* ]] && return 0
    mkdir -p "$DIR/bin"
    rm -rf "${DIR:?}/$name"
    "$PY" -m venv "$DIR/$name"
    "$DIR/$name/bin/pip" install -q "$requirement"
    [[ "$("$@" 2>/dev/null)" == *"${requirement#*==}"* ]] || {
        echo "$requirement in $DIR/$name does not run: $* fails" >&2
        exit 1
    }
}

# The Open Inference Protocol servers, each in its venv; a rerun that finds them installs nothing.
MLSERVER_VERSION=1.7.1
KSERVE_VERSION=0.21.0
venv_peer mlserver "mlserver==$MLSERVER_VERSION" "$DIR/mlserver/bin/mlserver" --version
printf '#!/bin/sh\nexec "%s" "$@"\n' "$DIR/mlserver/bin/mlserver" >"$DIR/bin/mlserver"
venv_peer kserve "kserve==$KSERVE_VERSION" \
    "$DIR/kserve/bin/python" -c 'import importlib.metadata as m; print(m.version("kserve"))'
printf '#!/bin/sh\nexec "%s" "$@"\n' "$DIR/kserve/bin/python" >"$DIR/bin/kserve-python"
chmod +x "$DIR/bin/mlserver" "$DIR/bin/kserve-python"

if ready; then
    echo "peers ready in $DIR"
    exit 0
fi

# perf_analyzer links libb64; the python backend's stub links Debian's libpython3.11. (The cache is
# read once into a variable: grep -q on a pipe can stop ldconfig early and fail it under pipefail.)
libs=$(ldconfig -p)
if ! grep -q 'libb64\.so\.0d' <<<"$libs" || ! grep -q 'libpython3\.11\.so\.1' <<<"$libs"; then
    as_root apt-get update -qq >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d python3.11 libpython3.11 >/dev/null
fi

mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/libexec" "$DIR/wheels" "$DIR/backends/python"
# pip keeps a wheel that is already in the folder, so a rerun downloads nothing.
"$PY" -m pip download -q --no-deps "${CP311[@]}" -d "$DIR/wheels" \
    tritonclient==2.48.0 nvidia-cuda-runtime-cu12==12.9.79 nvidia-pytriton==0.7.0

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
extract "$DIR"/wheels/tritonclient-2.48.0-*.whl "$stage" tritonclient-2.48.0.data/data/bin/perf_analyzer
extract "$DIR"/wheels/nvidia_cuda_runtime_cu12-12.9.79-*.whl "$stage" nvidia/cuda_runtime/lib/libcudart.so.12
extract "$DIR"/wheels/nvidia_pytriton-0.7.0-*.whl "$stage" nvidia_pytriton.libs/ pytriton/tritonserver/bin/ \
    pytriton/tritonserver/backends/python/ pytriton/tritonserver/python_backend_stubs/3.11/

cp "$stage/tritonclient-2.48.0.data/data/bin/perf_analyzer" "$DIR/libexec/"
cp "$stage/nvidia/cuda_runtime/lib/libcudart.so.12" "$DIR/lib/"
triton="$stage/pytriton/tritonserver"
cp "$triton/bin/tritonserver" "$DIR/libexec/"
rm -rf "$DIR/triton_libs"
cp -r "$stage/nvidia_pytriton.libs" "$DIR/triton_libs"
cp "$triton/backends/python/libtriton_python.so" "$triton/backends/python/triton_python_backend_utils.py" \
    "$triton/python_backend_stubs/3.11/triton_python_backend_stub" "$DIR/backends/python/"
chmod +x "$DIR/libexec/perf_analyzer" "$DIR/libexec/tritonserver" "$DIR/backends/python/triton_python_backend_stub"

wrapper perf_analyzer "$DIR/lib"
# PYTHONHOME: the stub's libpython3.11 is Debian's, so it wants Debian's standard library.
wrapper tritonserver "$DIR/triton_libs" PYTHONHOME=/usr

# What python-backend models import (perfkit/testing/models.py), where the stub looks for it.
if ! model_packages_ready; then
    as_root "$PY" -m pip install -q "${CP311[@]}" --target "$MODEL_SITE" "numpy<2" onnxruntime
fi

ready || { echo "the peers in $DIR are incomplete: $DIR/bin/perf_analyzer --version fails or a file is missing" >&2; exit 1; }
echo "peers ready in $DIR"
