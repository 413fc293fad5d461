"""The compiler's layers import in one direction: no import cycle among the modules of
tiled/compiler/passes and tiled/compiler/targets (counting imports inside functions: a
deferred import hides a cycle from Python, not from a reader), and the target-independent
passes import no target."""

import ast
from pathlib import Path

COMPILER = Path(__file__).resolve().parents[2] / "tiled" / "compiler"
LAYERS = ("passes", "targets")


def _module(path: Path) -> str:
    rel = path.relative_to(COMPILER.parent.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for layer in LAYERS for p in (COMPILER / layer).rglob("*.py")]
    modules = {_module(p): p for p in files}
    return {m: {d for d in _imports(p) if d in modules and d != m} for m, p in modules.items()}


def test_no_import_cycles_among_passes_and_targets():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            assert state.get(d) != 1, "import cycle: " + " -> ".join([*path, m, d])
            if d not in state:
                visit(d, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert graph.get("tiled.compiler.targets.cuda.lower"), "the walk read no imports"


def test_passes_import_no_target():
    for m, deps in _graph().items():
        if m.startswith("tiled.compiler.passes"):
            bad = {d for d in deps if d.startswith("tiled.compiler.targets")}
            assert not bad, f"{m} is target-independent but imports {sorted(bad)}"
