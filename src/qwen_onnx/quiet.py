"""Third-party import notices that read like failures, filtered from the logs and explained once.

Importing litert-torch (the tflite variant) pulls in torchao and TensorFlow, which announce at import
time what they will not use here:

- torchao: ``Failed to load .../torchao/_C_mxfp8...so`` and ``_C_cutlass_90a``: its CUDA kernels
  (MX-FP8, CUTLASS for sm_90a), which a CPU run never calls (logger ``torchao``, WARNING);
- torch: ``<enum 'KernelPreference'> is an Enum subclass ... register_constant() ... deprecated``,
  torchao registering an enum with torch.compile (logger ``torch.utils._pytree``);
- TensorFlow's C++ start-up lines ("This TensorFlow binary is optimized to use available CPU
  instructions ... rebuild TensorFlow with the appropriate compiler flags", oneDNN notices): INFO and
  WARNING of TensorFlow's own logging, silenced with ``TF_CPP_MIN_LOG_LEVEL=2`` (errors still print).

Each filtered kind is named once in the log at DEBUG (``qwen-onnx -v``), with why it is harmless, so that a
stage's one-line refusal is the only line a user reads.

transformers also imports TensorFlow and JAX whenever they are installed (tensorflow-cpu comes with
litert-torch, in the TFLite environment ``.venv-tflite`` only: :mod:`qwen_onnx.run.tflite_env`), though
nothing here runs a transformers TensorFlow or Flax model: ``USE_TF=0`` and
``USE_FLAX=0`` (transformers' own switches, ``transformers.utils.import_utils``) skip them. Importing
transformers with a tokenizer and the Qwen2 model took about twice the CPU time with them as without
(docs/timing.md), in every process that loads a tokenizer: the accuracy, task, reference,
quantization and timing jobs, and each PyTorch measurement of the sitting. litert-torch imports
TensorFlow itself, unaffected.
"""

from __future__ import annotations

import logging
import os
import re

#: (logger name, message pattern, why it is harmless): the notices :func:`quiet_third_party` drops.
NOISE: tuple[tuple[str, str, str], ...] = (
    ("torchao", r"^Failed to load .*torchao/_C_", "torchao's CUDA kernels (MX-FP8, CUTLASS), unused on the CPU"),
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile",
     "torchao registering an enum with torch.compile, a deprecation notice"),
    ("torchao.kernel.intmm", r"Detected no triton", "torchao's Triton kernels, unused on the CPU"),
    ("transformers.modeling_utils", r"were not initialized from the model checkpoint|You should probably TRAIN",
     "transformers' notice of weights a checkpoint lacks, which resolve refuses by name (check_complete)"),
)


class _NoiseFilter(logging.Filter):
    def __init__(self, pattern: str, why: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)
        self.why = why
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.pattern.search(record.getMessage()):
            return True
        self.dropped += 1
        if self.dropped == 1:  # at DEBUG: a refusal stays the last and only line a user reads (-v shows these)
            logging.getLogger("qwen_onnx").debug("filtered %s notices (%s): %s", record.name, self.why,
                                                  record.getMessage()[:120])
        return False


#: Environment variables :func:`quiet_third_party` sets unless the user did (module docstring).
ENVIRONMENT: dict[str, str] = {"TF_CPP_MIN_LOG_LEVEL": "2", "USE_TF": "0", "USE_FLAX": "0"}


def quiet_third_party() -> None:
    """Install the filters of :data:`NOISE` (once per process) and set :data:`ENVIRONMENT` where the
    user did not. Call before the libraries are imported; child processes inherit the environment
    variables and call this themselves for the logging filters."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    for name, pattern, why in NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoiseFilter) for f in logger.filters):
            logger.addFilter(_NoiseFilter(pattern, why))
