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
