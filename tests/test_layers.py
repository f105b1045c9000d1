"""The package layering docs/design.md describes, checked on the import graph (imports inside
functions included): no import reaches a higher layer, and no two packages import each other,
directly or around a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "heisd"

# bottom to top; packages of one layer may import each other as long as no cycle forms
LAYERS = [
    {"__init__", "errors", "config_types", "lazy", "storage", "executors", "cuda_graphs"},  # base (executors: where jobs run)
    {"decoding"},  # the decoding core
    {"benchmarks", "data", "targets", "kinematics", "drafter", "retrieval"},  # components
    {"runtime"},  # policies, episodes, recording, evaluation, DAgger
    {"serving", "profiling", "client", "robots"},  # serving and the robot side, profiling
    {"commands", "flags"},  # the command line's commands
    {"cli", "__main__"},  # its entry point
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def import_edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the modules that import it (any import statement, at any depth)."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _package(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "heisd" and len(parts) > 1 and parts[1] != source:
                    edges.setdefault(source, {}).setdefault(parts[1], []).append(str(path.relative_to(PACKAGE)))
    return edges


def test_every_package_has_a_layer() -> None:
    packages = {_package(p) for p in PACKAGE.rglob("*.py")}
    assert packages <= set(RANK), f"give these a layer: {sorted(packages - set(RANK))}"


def test_no_import_goes_up_a_layer() -> None:
    upward = [f"{module} imports heisd.{target} ({source} is below {target})"
              for source, targets in import_edges().items() for target, modules in targets.items()
              for module in modules if RANK[target] > RANK[source]]
    assert not upward, "\n".join(upward)


def test_no_package_cycle() -> None:
    edges = {source: set(targets) for source, targets in import_edges().items()}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif len(path) < len(RANK):
                visit(nxt, path + [nxt])

    for start in sorted(edges):
        visit(start, [start])
    assert not cycles, "package cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])
