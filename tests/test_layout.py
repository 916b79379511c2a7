"""The package's layering: every module imports only its own layer and the layers below (docs/architecture.md),
with no import cycle."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

import qwen_onnx

PACKAGE = Path(qwen_onnx.__file__).parent

#: The layers from the bottom up: a module may import from its own layer and the ones before it. ``errors`` and
#: ``quiet`` are the base every layer uses; ``cli`` and ``snakemake_support`` sit on top.
LAYERS = ("errors", "quiet", "store", "settings", "run", "source", "convert", "quantize", "measure", "report", "cli",
          "snakemake_support")


def _rank(module: str) -> int:
    """Layer index of ``qwen_onnx.<layer>[.<module>]``; the base modules share rank 0."""
    layer = module.split(".")[1]
    if layer not in LAYERS:
        raise AssertionError(f"{module} is in no layer: add its folder to LAYERS and docs/architecture.md")
    return 0 if layer in ("errors", "quiet") else LAYERS.index(layer)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str) -> set[str]:
    """``qwen_onnx`` modules a module imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError("relative import: write qwen_onnx.<layer>.<module>")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qwen_onnx."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("qwen_onnx."))
    return found


def _upward(modules: dict[str, str]) -> list[str]:
    """``"importer -> imported"`` for every import of a higher layer."""
    for name in modules:
        if name != "qwen_onnx":
            _rank(name)
    return [f"{name} -> {target}" for name, source in sorted(modules.items()) for target in sorted(_imports(source))
            if name != "qwen_onnx" and _rank(target) > _rank(name)]


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


def _package() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_the_layer_check_sees_an_upward_import_and_a_cycle():
    assert _upward({"qwen_onnx.store.staging": "from qwen_onnx.measure.latency import prompt_tokens\n",
                    "qwen_onnx.report.build": "from qwen_onnx.store.staging import staged_dir\n"}) == [
        "qwen_onnx.store.staging -> qwen_onnx.measure.latency"]
    assert _upward({"qwen_onnx.run.session": "def f():\n    import qwen_onnx.cli.parser\n"}) == [
        "qwen_onnx.run.session -> qwen_onnx.cli.parser"]
    with pytest.raises(AssertionError, match="qwen_onnx.lab.x is in no layer"):
        _upward({"qwen_onnx.lab.x": ""})
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_a_higher_layer():
    assert _upward(_package()) == []


def test_no_import_cycle_between_modules():
    modules = _package()
    graph = {name: {m for m in _imports(source) if m in modules and m != name} for name, source in modules.items()}
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
    assert share_cores_politely("sitting") is False and "OMP_WAIT_POLICY" not in os.environ
    assert MEASURING_RULES == {"profile", "sitting", "machine"}
    assert share_cores_politely("reference") is True
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice wins
    assert share_cores_politely("export") is False
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_no_workflow_script_is_named_like_a_module_onnxruntime_imports_by_its_bare_name():
    """Snakemake appends workflow/scripts/ to a job's sys.path; onnxruntime.transformers appends its own
    folder after it and imports its modules by their bare names (``from float16 import ...``), so a
    wrapper of such a name would be imported in their place (why the float16 rule's script is
    convert_float16.py)."""
    import importlib.util
    import re

    ort = Path(importlib.util.find_spec("onnxruntime.transformers").origin).parent
    own = {p.stem for p in ort.rglob("*.py")}
    bare = set()
    for path in ort.rglob("*.py"):
        bare.update(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(encoding="utf-8", errors="replace"), re.MULTILINE))
    shadowed = own & bare
    assert "float16" in shadowed  # the check sees the module a float16.py wrapper would replace
    scripts = {p.stem for p in (PACKAGE.parents[1] / "workflow" / "scripts").glob("*.py")}
    assert scripts & shadowed == set()


def test_every_test_file_a_docstring_cites_exists():
    """A module that names the test behind a statement (``tests/store/test_faults.py``) names a file that is there:
    three citations still named files from before the tests moved into folders."""
    import re

    root = PACKAGE.resolve().parents[1]
    cited = {(path.relative_to(root).as_posix(), name)
             for path in PACKAGE.resolve().rglob("*.py")
             for name in re.findall(r"tests/[\w/]+\.py", path.read_text(encoding="utf-8"))}
    assert cited, "no citation found: the pattern no longer matches the docstrings"
    assert [c for c in cited if not (root / c[1]).is_file()] == []


#: The checkout (the installed package may live elsewhere, as in a non-editable install).
REPO = Path(__file__).resolve().parents[1]
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_HEX = re.compile(r"\b[0-9a-f]{7,12}\b")  # candidates; git says which are commits


def _code_and_config() -> list[Path]:
    workflow = [p for p in (REPO / "workflow").rglob("*") if p.suffix in (".smk", ".py", ".yaml", ".rst")]
    return [*sorted((REPO / "src" / "qwen_onnx").rglob("*.py")), *sorted(workflow), REPO / "Snakefile",
            REPO / "config.yaml"]


def _commits(words: set[str]) -> set[str]:
    """The ``words`` that name a commit of this repository (none where git or its history is missing)."""
    if not words or not (REPO / ".git").exists():
        return set()
    out = subprocess.run(["git", "-C", str(REPO), "cat-file", "--batch-check"], input="".join(
        f"{w}^{{commit}}\n" for w in sorted(words)), capture_output=True, text=True)
    return {w for w, line in zip(sorted(words), out.stdout.splitlines()) if not line.endswith("missing")}


def test_no_date_or_commit_in_code_comments_or_config():
    """A figure's date and commit belong in docs/ and CHANGELOG.md, beside the figure; code says what and why."""
    dates, words = [], {}
    for path in _code_and_config():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            dates += [f"{where}: date {m}" for m in _DATE.findall(line)]
            for word in _HEX.findall(line):
                words.setdefault(word, []).append(where)
    commits = [f"{where}: commit {c}" for c in sorted(_commits(set(words))) for where in words[c]]
    found = dates + commits
    assert not found, "move these to docs/ or CHANGELOG.md:\n" + "\n".join(found)


def test_the_date_and_commit_check_finds_them(tmp_path):
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if not head:
        pytest.skip("no git history")
    assert _DATE.findall("measured 2026-12-04 on") == ["2026-12-04"]
    assert _commits(set(_HEX.findall(f"at {head}, block 0x7f, sha deadbeef"))) == {head}


def test_every_module_is_under_500_lines():
    """A module a newcomer reads in one sitting; past that, split it by concern (docs/architecture.md)."""
    long = {str(p.relative_to(REPO)): n for p in (REPO / "src" / "qwen_onnx").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) >= 500}
    assert not long, long
