"""Fake GGUF part packages (importable, each with ``get_part_path()``), as the embedded models ship."""

import textwrap


def make_part_packages(root, prefix, chunks):
    """Write importable fake part packages ``{prefix}1..N`` under ``root``; returns their names."""
    names = []
    for i, chunk in enumerate(chunks, start=1):
        module = root / f"{prefix}{i}"
        (module / "data").mkdir(parents=True)
        (module / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (module / "__init__.py").write_text(
            textwrap.dedent(
                f"""
                import os
                def get_part_path():
                    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "part{i:02d}.bin")
                """
            )
        )
        names.append(f"{prefix}{i}".replace("_", "-"))
    return names


def embedded_parts_installed() -> bool:
    """Whether the embedded 0.5B's GGUF part packages are installed (``envs/setup.sh --models``; CI runs without)."""
    from qwen_onnx.errors import PartError
    from qwen_onnx.source.gguf_file import EMBEDDED, locate_parts

    try:
        locate_parts(EMBEDDED["qwen2.5-coder-0.5b-instruct-q4_k_m"])
    except PartError:
        return False
    return True
