"""The package's layout: no import cycle between its modules (one direction of dependency each)."""

import ast
from pathlib import Path

import qwen_onnx

PACKAGE = Path(qwen_onnx.__file__).parent


def _imports(path: Path) -> set[str]:
    """Sibling modules a module imports, at top level or inside functions (``from .x import ...``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qwen_onnx."):
            found.add(node.module.split(".")[1])
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return cycles


def test_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}
    assert graph["quantize"] >= {"activation_ranges", "smoothquant", "matmuls", "blockwise", "sensitivity"}
    assert _cycles(graph) == []


def test_workflow_scripts_import_no_torch_before_the_job_starts():
    """The OpenMP wait policy (snakemake_support.share_cores_politely) must be set before torch loads."""
    import subprocess
    import sys

    scripts = sorted((PACKAGE.parents[1] / "workflow" / "scripts").glob("*.py"))
    assert len(scripts) >= 15
    imports = []
    for path in scripts:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(ast.unparse(node))
    code = "\n".join(dict.fromkeys(imports)) + "\nimport sys\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_jobs_that_share_cores_get_a_passive_openmp_wait_policy(monkeypatch):
    import os

    from qwen_onnx.snakemake_support import MEASURING_RULES, share_cores_politely

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert share_cores_politely("peers") is False and "OMP_WAIT_POLICY" not in os.environ
    assert MEASURING_RULES == {"profile", "peers", "machine"}
    assert share_cores_politely("reference") is True
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice wins
    assert share_cores_politely("export") is False
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
