"""The backends import each other in one direction: no import cycle among the modules of
tiled/compiler/backends, counting imports inside functions (a deferred import hides a cycle
from Python, not from a reader)."""

import ast
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[2] / "tiled" / "compiler" / "backends"
PACKAGE = "tiled.compiler.backends"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.startswith(PACKAGE + "."):
            out.add(node.module[len(PACKAGE) + 1:].split(".")[0])
        elif isinstance(node, ast.Import):
            out |= {a.name[len(PACKAGE) + 1:].split(".")[0] for a in node.names
                    if a.name.startswith(PACKAGE + ".")}
    return out


def test_no_import_cycles_among_the_backends():
    graph = {p.stem: _imports(p) - {p.stem} for p in BACKENDS.glob("*.py")}
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
    assert graph.get("cuda_lower"), "the walk read no imports"
