"""Provenance: the installed versions of the libraries that shape an artifact, recorded in every report and
manifest.
"""

from __future__ import annotations

import importlib.metadata

#: Distributions whose versions are recorded in every provenance file.
TRACKED_PACKAGES = (
    "qwen-onnx",
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "onnx",
    "onnxruntime",
    "gguf",
    "numpy",
)


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a pip name), ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that shape the artifacts, ``None`` for a missing one."""
    return {name: package_version(name) for name in TRACKED_PACKAGES}
