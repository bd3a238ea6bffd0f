"""The project's module layout, stated as rules that hold: no import cycles among its modules
(imports inside functions count); the packages import only downwards (llm_envs <- trainers <-
eval, benchmarks); inside trainers/ each part imports only what ``MAY_IMPORT`` lists (the engines
know perturbations and the progress display, never ES or RL); common/ holds only what both ES and
RL use; and the folders of trainers/ and benchmarks/ are the ones their docstrings describe."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llm_envs", "trainers", "eval", "benchmarks")
#: Which packages each package may import (its own modules and the layers below it). benchmarks is
#: the top: its study runs the trainers and measures their models with the eval harness.
ALLOWED = {"llm_envs": {"llm_envs"}, "trainers": {"llm_envs", "trainers"},
           "eval": {"llm_envs", "trainers", "eval"}, "benchmarks": {"llm_envs", "trainers", "eval", "benchmarks"}}
#: Commands that live with the package they serve but run a layer above it (inside a function, so
#: importing the package never imports that layer): ``python -m llm_envs.check ENV --model M``
#: samples episodes with the trainers' runner, as training would.
COMMANDS_ABOVE = {"llm_envs.check": {"trainers"}}
#: The parts of trainers/ (a module belongs to the longest prefix that names it) and the other
#: parts each may import, besides its own modules. ``trainers`` is the entry points (grpo.py, ppo.py,
#: sweep.py) and TRL interop (trl.py): they may import every part.
MAY_IMPORT = {
    "trainers.es.noise": set(),  # the perturbations: below the engines that evaluate them
    "trainers.common.progress": set(),  # the one progress display: the engines draw bars too
    "trainers.engines": {"trainers.es.noise", "trainers.common.progress"},
    "trainers.common": {"trainers.engines", "trainers.es.noise", "trainers.common.progress"},
    "trainers.es": {"trainers.common", "trainers.common.progress", "trainers.engines", "trainers.es.noise"},
    "trainers.rl": {"trainers.common", "trainers.common.progress", "trainers.engines"},
}
TRAINER_FOLDERS = ("common", "engines", "es", "rl")


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
    assert len(graph) > 30 and "trainers.es.train" in graph["trainers.es.replay"]  # the graph is real
    assert "trainers.es.noise.members" in graph["trainers.engines.base"]
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
                   if d.split(".")[0] not in ALLOWED[m.split(".")[0]] | COMMANDS_ABOVE.get(m, set()))
    assert not wrong, wrong
    # nothing in the package imports such a command: ``import llm_envs`` stays free of the layer above
    assert not [m for m, deps in graph.items() for d in deps if d in COMMANDS_ABOVE and m != d]


def test_each_public_name_is_defined_once():
    """One home per concept: a public function or class of trainers/, eval/ and benchmarks/ is
    defined in one module; the verbs every command has (``main``, ``parse``, a child process's
    ``child``, a benchmark's ``measure``, ...) are each command's own, and each algorithm its ``Batch``."""
    own = {"train", "resolve", "main", "parse", "child", "measure", "load", "ratios", "run", "Batch"}
    defined: dict[str, list[str]] = {}
    for package in ("trainers", "eval", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                    defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in defined.items() if len(paths) > 1 and name not in own}
    assert not twice, twice


def part_of(module: str) -> str:
    """The part of trainers/ ``module`` belongs to (``MAY_IMPORT``'s longest matching prefix)."""
    matches = [p for p in MAY_IMPORT if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else "trainers"


def wrong_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports between parts of trainers/ that ``MAY_IMPORT`` does not allow."""
    wrong = []
    for m, deps in graph.items():
        if not m.startswith("trainers.") or part_of(m) == "trainers":
            continue
        for d in deps:
            if d.startswith("trainers") and part_of(d) != part_of(m) and part_of(d) not in MAY_IMPORT[part_of(m)]:
                wrong.append(f"{m} ({part_of(m)}) imports {d} ({part_of(d)})")
    return sorted(wrong)


def test_trainers_parts_import_only_what_they_may():
    graph = import_graph(project_modules())
    assert {part_of(m) for m in graph if m.startswith("trainers.")} == {*MAY_IMPORT, "trainers"}
    assert not wrong_imports(graph), wrong_imports(graph)


def test_the_part_check_catches_an_engine_importing_es(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    for folder in ("engines", "es", "es/noise"):
        (tmp_path / "trainers" / folder).mkdir()
    (tmp_path / "trainers" / "engines" / "hf.py").write_text("def f():\n    from trainers.es.train import g\n")
    (tmp_path / "trainers" / "es" / "train.py").write_text("from trainers.es.noise.lowrank import h\ndef g(): ...\n")
    (tmp_path / "trainers" / "es" / "noise" / "lowrank.py").write_text("def h(): ...\n")
    graph = import_graph(project_modules(tmp_path))
    assert wrong_imports(graph) == ["trainers.engines.hf (trainers.engines) imports trainers.es.train (trainers.es)"]


def families(module: str, graph: dict[str, set[str]], seen: frozenset = frozenset()) -> set[str]:
    """The algorithm families (es, rl) that use ``module``, directly or through common/ and engines/."""
    found = set()
    for importer, deps in graph.items():
        if module not in deps or importer in seen:
            continue
        if part_of(importer) in ("trainers.es", "trainers.es.noise"):
            found.add("es")
        elif part_of(importer) == "trainers.rl":
            found.add("rl")
        elif part_of(importer) in ("trainers.common", "trainers.common.progress", "trainers.engines"):
            found |= families(importer, graph, seen | {module})
    return found


def test_common_holds_only_what_both_families_use():
    graph = import_graph(project_modules())
    common = [m for m in graph if m.startswith("trainers.common.")]
    assert len(common) > 10
    one_family = {m: sorted(families(m, graph)) for m in common if families(m, graph) != {"es", "rl"}}
    assert not one_family, f"used by one family only (move it into that family's package): {one_family}"


def test_every_trainers_folder_says_what_it_holds():
    """Each folder's __init__ docstring names what it holds; trainers/__init__ gives one line per folder."""
    top = ast.get_docstring(ast.parse((ROOT / "trainers" / "__init__.py").read_text()))
    for folder in TRAINER_FOLDERS:
        doc = ast.get_docstring(ast.parse((ROOT / "trainers" / folder / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"trainers/{folder}/__init__.py needs a docstring"
        assert f"``{folder}/``" in top, f"trainers/__init__.py should describe {folder}/"
    folders = sorted(p.name for p in (ROOT / "trainers").iterdir() if (p / "__init__.py").is_file())
    assert folders == sorted(TRAINER_FOLDERS), folders
    flat = [p.name for p in (ROOT / "trainers").glob("*.py") if p.name != "__init__.py"]
    assert sorted(flat) == ["grpo.py", "merge.py", "ppo.py", "sweep.py", "trl.py"], flat


def test_benchmarks_folders_say_which_is_which():
    """The study, speed, memory and GPU tools each have a folder that says what it holds; at the top
    only the lent GPU's launcher, under the name the developers' brief gives it."""
    folders = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if (p / "__init__.py").is_file())
    assert folders == ["gpu", "memory", "speed", "study"], folders
    for folder in folders:
        doc = ast.get_docstring(ast.parse((ROOT / "benchmarks" / folder / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"benchmarks/{folder}/__init__.py needs a docstring"
    flat = [p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"]
    assert flat == ["lent_gpu.py"], flat
