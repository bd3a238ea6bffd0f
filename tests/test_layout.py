"""The project's module layout: no import cycles among its modules (imports inside functions
count), the packages only import downwards (llm_envs <- trainers <- eval, benchmarks), and so do
the folders inside trainers/ (noise <- engines <- common <- rl <- the algorithms)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llm_envs", "trainers", "eval", "benchmarks")
#: Which packages each package may import (its own modules and the layers below it). benchmarks is
#: the top: its study runs the trainers and measures their models with the eval harness.
ALLOWED = {"llm_envs": {"llm_envs"}, "trainers": {"llm_envs", "trainers"},
           "eval": {"llm_envs", "trainers", "eval"}, "benchmarks": {"llm_envs", "trainers", "eval", "benchmarks"}}
#: The folders of trainers/, bottom first; the algorithms (trainers/*.py) sit above them all. A
#: module may import its own folder and the folders below it, never one above.
TRAINER_FOLDERS = ("noise", "engines", "common", "rl")


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
    assert "trainers.noise.members" in graph["trainers.engines.base"]
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


def trainer_level(module: str) -> int:
    """Where a trainers module sits: the index of its folder in TRAINER_FOLDERS (subfolders count
    as their folder), or above them all for the algorithms in trainers/ itself."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in TRAINER_FOLDERS):
        return TRAINER_FOLDERS.index(parts[1])
    return len(TRAINER_FOLDERS)


def test_trainer_folders_import_only_downwards():
    graph = import_graph(project_modules())
    folders = {m.split(".")[1] for m in graph if m.startswith("trainers.") and m.count(".") >= 2}
    assert folders == set(TRAINER_FOLDERS), "a new folder in trainers/ needs its place in TRAINER_FOLDERS"
    wrong = sorted(f"{m} imports {d}" for m, deps in graph.items() if m.startswith("trainers.")
                   for d in deps if d.startswith("trainers.") and trainer_level(d) > trainer_level(m))
    assert not wrong, wrong


def test_engines_import_no_es_or_rl_code():
    """Engines evaluate perturbations (trainers.noise); ES and RL build on engines, never the reverse."""
    graph = import_graph(project_modules())
    engines = [m for m in graph if m.startswith("trainers.engines")]
    assert len(engines) > 8
    wrong = sorted(f"{m} imports {d}" for m in engines for d in graph[m]
                   if d.startswith("trainers.") and not d.startswith(("trainers.engines", "trainers.noise")))
    assert not wrong, wrong


def test_the_level_check_catches_an_upward_import(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "trainers" / "noise").mkdir()
    (tmp_path / "trainers" / "noise" / "fullrank.py").write_text("def f():\n    from trainers.es import g\n")
    (tmp_path / "trainers" / "es.py").write_text("def g(): ...\n")
    graph = import_graph(project_modules(tmp_path))
    assert graph["trainers.noise.fullrank"] == {"trainers.es"}
    assert trainer_level("trainers.es") > trainer_level("trainers.noise.fullrank")


def test_every_trainers_folder_says_what_it_holds():
    """Each folder's __init__ docstring names what it holds; trainers/__init__ gives one line per folder."""
    top = ast.get_docstring(ast.parse((ROOT / "trainers" / "__init__.py").read_text()))
    for folder in TRAINER_FOLDERS:
        doc = ast.get_docstring(ast.parse((ROOT / "trainers" / folder / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"trainers/{folder}/__init__.py needs a docstring"
        assert f"``{folder}/``" in top, f"trainers/__init__.py should describe {folder}/"
    flat = [p.name for p in (ROOT / "trainers").glob("*.py") if p.name != "__init__.py"]
    assert sorted(flat) == ["es.py", "grpo.py", "ppo.py", "replay.py", "sweep.py"], flat
