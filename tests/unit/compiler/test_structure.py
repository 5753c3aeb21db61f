"""The compiler's shape: every registered lowering has its test case, every node kind its emitter, and the
modules import each other without a circle."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from activities.kernels import compiler  # noqa: F401 - registers the lowerings and emitters
from activities.kernels import optimizer
from activities.kernels.compiler.graph import NODE_OPS
from activities.kernels.compiler.registry import EMITTERS, LOWERINGS

ROOT = Path(__file__).resolve().parents[3]
KERNELS = ROOT / "activities" / "kernels"


def test_every_registered_lowering_has_a_case_in_the_test_module_named_after_its_module():
    missing = []
    for op, lowering in LOWERINGS.items():
        module = lowering.module.rsplit(".", 1)[1]
        cases = importlib.import_module(f"tests.unit.compiler.test_lowerings_{module}").CASES
        if not any(key.split(":")[0] == op for key in cases):
            missing.append(f"{op} ({module})")
    assert not missing, f"lowerings without a test case: {missing}"


def test_every_case_names_a_registered_op():
    for path in sorted((ROOT / "tests" / "unit" / "compiler").glob("test_lowerings_*.py")):
        cases = importlib.import_module(f"tests.unit.compiler.{path.stem}").CASES
        assert {k.split(":")[0] for k in cases} <= set(LOWERINGS), path.name


def test_every_node_kind_but_inputs_has_one_emitter():
    optimizer.load()  # the optimizer's rewrites add node kinds of their own, emitted through the same registry
    assert set(EMITTERS) == set(NODE_OPS) - {"input", "param"} | set(optimizer.NODE_OPS)


def _imports(path: Path, package: str) -> set[str]:
    """The modules of ours `path` imports at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("activities.kernels"):
                for alias in sub.names:
                    name = f"{sub.module}.{alias.name}"
                    found.add(name if (ROOT / (name.replace(".", "/") + ".py")).exists()
                              or (ROOT / name.replace(".", "/")).is_dir() else sub.module)
            elif isinstance(sub, ast.Import):
                found |= {a.name for a in sub.names if a.name.startswith("activities.kernels")}
    return found - {package}


def _module_graph() -> dict[str, set[str]]:
    files = sorted((KERNELS / "compiler").rglob("*.py")) + [KERNELS / "offline_designer.py", KERNELS / "offline_coder.py"]
    graph = {}
    for path in files:
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = _imports(path, name)
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (module -> the modules it imports), or []."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str]:
        if state.get(m) == 2 or m not in graph:
            return []
        if state.get(m) == 1:
            return path[path.index(m):] + [m]
        state[m] = 1
        for dep in sorted(graph[m]):
            if found := visit(dep, path + [m]):
                return found
        state[m] = 2
        return []

    for m in sorted(graph):
        if found := visit(m, []):
            return found
    return []


def test_the_reader_designer_coder_and_blocks_import_without_a_circle():
    graph = _module_graph()
    assert {"activities.kernels.compiler.reader", "activities.kernels.offline_designer",
            "activities.kernels.offline_coder", "activities.kernels.compiler.blocks.matmul"} <= set(graph)
    assert find_circle(graph) == []


def test_the_circle_check_finds_a_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
