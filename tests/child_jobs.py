"""Module-level functions for tests that run them in ``spawn`` children (they must be importable)."""

import os
import signal


def square(x: int) -> int:
    return x * x


def die_by_signal(number: int) -> None:
    os.kill(os.getpid(), number)


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def told_busy(cores_busy: bool = False) -> dict:
    return {"decode_tok_s": 1.0, "cores_busy": cores_busy}


SIGILL = int(signal.SIGILL)


def build_variant(kind: str, dirs: dict, calibration_text: str, output: str, cores: int) -> dict:
    """Build one quantized variant of the tiny pipeline on ``cores`` CPU cores (process affinity)
    and return the sha256 of each ONNX file it wrote (:mod:`tests.test_determinism`)."""
    import hashlib
    from pathlib import Path

    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    from qwen_onnx.convert.float16 import convert_float16_variant
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
    from qwen_onnx.quantize.int8 import (
        DynamicSettings,
        StaticSettings,
        quantize_dynamic_variant,
        quantize_static_variant,
    )

    small_static = dict(samples=4, sequence_length=32)
    small_int4 = dict(block_size=16, block_size_8bit=16, embedding_block_size=16)
    builds = {
        "int8-dynamic per_tensor": lambda: quantize_dynamic_variant(dirs["preprocessed"], output,
                                                                    DynamicSettings(scheme="per_tensor")),
        "int8-dynamic blockwise": lambda: quantize_dynamic_variant(dirs["optimized"], output,
                                                                   DynamicSettings(block_size=16)),
        "int8-static Percentile + Hadamard": lambda: quantize_static_variant(
            dirs["optimized"], output, calibration_text, StaticSettings(**small_static, block_size=16)),
        "int8-static reduce_range": lambda: quantize_static_variant(
            dirs["optimized"], output, calibration_text, StaticSettings(**small_static, block_size=16, reduce_range=True)),
        "int8-static Search": lambda: quantize_static_variant(
            dirs["preprocessed"], output, calibration_text,
            StaticSettings(**small_static, method="Search", hadamard_roles=[], search_tokens=64)),
        "int8-static SmoothQuant": lambda: quantize_static_variant(
            dirs["preprocessed"], output, calibration_text,
            StaticSettings(**small_static, method="MinMax", smooth=True, hadamard_roles=[], search_tokens=64)),
        "int4 k_quant_int": lambda: quantize_int4_variant(
            dirs["optimized"], output, Int4Settings(**small_int4, importance_samples=2, calibration_sequence_length=32),
            calibration_text=calibration_text, threads=cores),
        "int4 rtn": lambda: quantize_int4_variant(dirs["optimized"], output, Int4Settings(**small_int4, algorithm="rtn")),
        "fp16": lambda: convert_float16_variant(dirs["fp32"], output),
    }
    builds[kind]()
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(output).iterdir())
            if p.suffix == ".onnx" or p.name.endswith(".onnx_data")}


def build_variants(kinds: list[str], dirs: dict, calibration_text: str, output: str, cores: int) -> dict:
    """:func:`build_variant` of each of ``kinds`` in turn, in this one process, into ``output/<index>``: kind ->
    its files' sha256, or the error its build raised (one process for all the kinds saves an interpreter start
    and the imports per build)."""
    from pathlib import Path

    built = {}
    for kind in kinds:
        try:
            built[kind] = build_variant(kind, dirs, calibration_text, str(Path(output) / str(BUILD_KINDS.index(kind))),
                                        cores)
        except Exception as exc:  # noqa: BLE001 - the test of that kind names it
            built[kind] = f"{type(exc).__name__}: {exc}"
    return built


BUILD_KINDS = ("int8-dynamic per_tensor", "int8-dynamic blockwise", "int8-static Percentile + Hadamard",
               "int8-static reduce_range", "int8-static Search", "int8-static SmoothQuant", "int4 k_quant_int",
               "int4 rtn", "fp16")
