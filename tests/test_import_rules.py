"""The import rules of ARCHITECTURE.md, checked on the source (every import statement, function-level ones
included) and on the login-node CLI as it runs: no upward arrows, no cycles, no private names of other packages,
and no heavy library (scipy, numpy, wandb, optuna, torch, plotly, jinja2) loaded by `mbx --help`,
`mbx campaign validate` or `mbx campaign plan`."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGES = ("orchestrator", "launchers", "reports", "trainer")
HEAVY = ("scipy", "numpy", "wandb", "optuna", "torch", "plotly", "jinja2")
# The torch-free trainer modules the login side may import (ARCHITECTURE.md).
TRAINER_FOR_LOGIN = {"trainer.recipe", "trainer.rundir", "trainer.atomic", "trainer.flops", "trainer.memory",
                     "trainer.bridge_args"}  # bridge_args: run_recipe.py's grammar, standard library only
TRAINER_FOR_LAUNCHERS = {"trainer.rundir", "trainer.jit_cache"}


@cache
def modules() -> dict[str, Path]:
    """Every module of the shipped packages by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(dotted name, line) for every import in the file; `from a import b` gives a.b (b a module or a name in a)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = [*package[: len(package) - node.level + 1]] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            yield from ((f"{base}.{alias.name}", node.lineno) for alias in node.names)


def own_module(name: str) -> str | None:
    """The mbx module a dotted name lands in (`orchestrator.run.store.Store` → orchestrator.run.store), or None."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@cache
def arrows() -> dict[str, set[tuple[str, int]]]:
    """module → {(imported mbx module, line)}, function-level imports included (those under `if TYPE_CHECKING:`
    never run and are left out)."""
    found: dict[str, set[tuple[str, int]]] = {}
    for name, path in modules().items():
        runs = {node.lineno for node in runtime_imports(path)}
        targets = {(own_module(n), line) for n, line in imported_names(name, path)
                   if n.split(".")[0] in PACKAGES and line in runs}  # fmt: skip
        found[name] = {(t, line) for t, line in targets if t and t != name}
    return found


def violations(package: str, allowed) -> list[str]:
    out = []
    for name, path in modules().items():
        if name.split(".")[0] != package:
            continue
        for imported, line in imported_names(name, path):
            if not allowed(imported):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    return sorted(set(out))


def test_the_source_tree_is_found() -> None:
    assert {"orchestrator.cli.app", "orchestrator.run.engine", "reports.gates", "trainer.recipe", "launchers.base"} <= set(
        modules()
    )


def test_trainer_never_imports_the_login_side() -> None:
    assert violations("trainer", lambda n: n.split(".")[0] not in ("orchestrator", "launchers", "reports")) == []


def test_reports_never_import_the_orchestrator_or_torch() -> None:
    def allowed(n: str) -> bool:
        top = n.split(".")[0]
        return top not in ("orchestrator", "torch") and (top != "trainer" or own_module(n) in TRAINER_FOR_LOGIN)

    assert violations("reports", allowed) == []


def test_the_orchestrator_imports_no_torch_and_only_torch_free_trainer_modules() -> None:
    def allowed(n: str) -> bool:
        top = n.split(".")[0]
        return top != "torch" and (top != "trainer" or own_module(n) in TRAINER_FOR_LOGIN)

    assert violations("orchestrator", allowed) == []


def test_launchers_import_no_torch_no_orchestrator_and_two_trainer_modules() -> None:
    def allowed(n: str) -> bool:
        top = n.split(".")[0]
        return top not in ("torch", "orchestrator") and (top != "trainer" or own_module(n) in TRAINER_FOR_LAUNCHERS)

    assert violations("launchers", allowed) == []


def test_a_launcher_backend_is_one_module_of_hooks() -> None:
    """ARCHITECTURE.md, "Where a new part goes": a launcher backend is one module of launchers/backends/ that no
    other module imports (the registry loads it by name) and that imports no other backend; a Slurm backend leaves
    the common path to the Slurm base: it imports neither the packing (launchers.slurm.pack) nor the node side, and
    writes hooks only (render and launch are the base's template methods)."""
    from launchers import registry
    from launchers.slurm.launcher import SlurmLauncher

    backends = {name for name in modules() if name.startswith("launchers.backends.")}
    base_only = ("launchers.slurm.pack", "launchers.node")
    out = []
    for name, path in modules().items():
        for imported, line in imported_names(name, path):
            target = own_module(imported) if imported.split(".")[0] in PACKAGES else None
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if target in backends and target != name:
                out.append(f"{where}, another backend")
            if name in backends and target and target.startswith(base_only):
                out.append(f"{where} (the Slurm base's packing, or the node side)")
    for backend in registry.backends().values():
        if issubclass(backend, SlurmLauncher):
            out += [f"{backend.__module__}.{backend.__name__} overrides {method}"
                    for method in ("render", "launch") if method in vars(backend)]  # fmt: skip
    assert out == []


def test_no_module_imports_an_underscore_module_of_another_mbx_package() -> None:
    found = []
    for name, path in modules().items():
        for imported, line in imported_names(name, path):
            target = own_module(imported) if imported.split(".")[0] in PACKAGES else None
            private = target and any(p.startswith("_") and p != "__main__" for p in target.split(".")[1:])
            if private and target.split(".")[0] != name.split(".")[0]:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert found == []


def cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), function-level imports counted."""
    graph = {name: {t for t, _ in targets} for name, targets in arrows().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                groups.append(sorted([v, *group]))

    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycles_counting_function_level_imports() -> None:
    assert cycles() == []


def test_no_private_names_of_other_libraries() -> None:
    found = []
    for name, path in modules().items():
        for imported, line in imported_names(name, path):
            top, *rest = imported.split(".")
            if top not in PACKAGES and any(p.startswith("_") and not p.startswith("__") for p in rest):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert found == []


PROBE = """
import sys
sys.argv = ["mbx", *sys.argv[1:]]
from orchestrator.cli.app import main
try:
    main()
except SystemExit:
    pass
heavy = {m.split(".")[0] for m in sys.modules} & set(HEAVY)
print("LOADED:" + ",".join(sorted(heavy)), file=sys.stderr)
""".replace("HEAVY", repr(HEAVY))


def loaded(*args: str) -> list[str]:
    """The heavy libraries in sys.modules after `mbx ARGS` ran in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)})  # fmt: skip
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("LOADED:")] or [proc.stderr[-2000:]]
    return [m for m in line.removeprefix("LOADED:").split(",") if m]


def test_importing_the_cli_loads_no_heavy_library() -> None:
    code = f"import sys, orchestrator.cli.app; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args",
    [("--help",), ("campaign", "--help"), ("campaign", "validate", "campaigns/quickstart.yaml"),
     ("campaign", "plan", "campaigns/quickstart.yaml")],
    ids=["help", "campaign-help", "validate", "plan"],
)  # fmt: skip
def test_login_commands_load_no_heavy_library(args: tuple[str, ...]) -> None:
    assert loaded(*args) == []


# orchestrator/ by role, lowest first (ARCHITECTURE.md): a package imports only from its own layer and below.
LAYERS = ("orchestrator.errors", "orchestrator.owned_dirs", "orchestrator.spec", "orchestrator.trainers",
          "orchestrator.run", "orchestrator.judge", "orchestrator.flow", "orchestrator.cli", "orchestrator.__main__")  # fmt: skip


def layer_of(module: str) -> int | None:
    return next((i for i, top in enumerate(LAYERS) if module == top or module.startswith(top + ".")), None)


def runtime_imports(path: Path) -> Iterator[ast.AST]:
    """Import statements that run (those under `if TYPE_CHECKING:` only name types for the checker)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
                   for n in ast.walk(node)}  # fmt: skip
    yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in typing_only)


def test_the_orchestrator_top_level_holds_only_its_role_packages() -> None:
    top = {p.name for p in (ROOT / "orchestrator").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top == {"__init__.py", "__main__.py", "errors.py", "owned_dirs.py", "spec", "trainers", "run", "judge",
                   "flow", "cli"}  # fmt: skip


def test_no_orchestrator_package_imports_a_higher_one() -> None:
    upward = []
    for name, path in modules().items():
        mine = layer_of(name)
        if mine is None:
            continue
        for node in runtime_imports(path):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [f"{node.module}.{a.name}" for a in node.names] if node.module else [])  # fmt: skip
            for target in targets:
                theirs = layer_of(own_module(target) or "") if target.startswith("orchestrator") else None
                if theirs is not None and theirs > mine:
                    upward.append(f"{path.relative_to(ROOT)}:{node.lineno} ({LAYERS[mine]}) imports {target}")
    assert upward == []


def test_no_trainer_kind_branches_outside_the_trainer_kinds() -> None:
    """A kind's differences live in orchestrator/trainers/ (ARCHITECTURE.md): elsewhere nothing compares a kind's
    name (`trainer_kind == "bundled"`, `campaign.trainer.kind != "command"`)."""
    names = {"bundled", "command"}
    found = []
    for name, path in modules().items():
        if name.startswith("orchestrator.trainers") or not name.startswith(("orchestrator", "reports", "launchers")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            kinds = [s for s in sides if isinstance(s, ast.Attribute) and s.attr in ("kind", "trainer_kind")]
            literal = [s for s in sides if isinstance(s, ast.Constant) and s.value in names]
            if kinds and literal:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
