"""The project's module layout: no import cycles among its modules (imports inside functions
count), and the layers only import downwards: llm_envs <- trainers <- eval, benchmarks."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llm_envs", "trainers", "eval", "benchmarks")
#: Which packages each package may import (its own modules and the layers below it). benchmarks is
#: the top: its study runs the trainers and measures their models with the eval harness.
ALLOWED = {"llm_envs": {"llm_envs"}, "trainers": {"llm_envs", "trainers"},
           "eval": {"llm_envs", "trainers", "eval"}, "benchmarks": {"llm_envs", "trainers", "eval", "benchmarks"}}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source (functions included)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets += [base] + [f"{base}.{alias.name}" for alias in node.names]
        deps = set()
        for target in targets:
            while target and target not in modules:  # "pkg.mod.name" -> "pkg.mod"
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first = last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    graph = import_graph(project_modules())
    assert len(graph) > 30 and "trainers.es" in graph["trainers.replay"]  # the graph is real
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles_inside_functions(tmp_path):
    (tmp_path / "llm_envs").mkdir()
    (tmp_path / "llm_envs" / "a.py").write_text("from llm_envs.b import f\n")
    (tmp_path / "llm_envs" / "b.py").write_text("def f():\n    from . import a\n")
    for package in PACKAGES[1:]:
        (tmp_path / package).mkdir()
    graph = import_graph(project_modules(tmp_path))
    assert find_cycle(graph) == ["llm_envs.a", "llm_envs.b", "llm_envs.a"]


def test_layers_import_only_downwards():
    graph = import_graph(project_modules())
    wrong = sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps
                   if d.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert not wrong, wrong


def test_each_public_function_of_trainers_and_eval_is_defined_once():
    entry_points = {"train", "resolve", "main"}  # every trainer and command has its own
    defined: dict[str, list[str]] = {}
    for package in ("trainers", "eval"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                    defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in defined.items() if len(paths) > 1 and name not in entry_points}
    assert not twice, twice
