"""The import rules of ARCHITECTURE.md, checked on the source (every import statement, function-level ones and
those under `if TYPE_CHECKING:` included) and on the login-node CLI as it runs: no upward arrows, no cycles, no
private names of other packages, and no heavy library (scipy, numpy, wandb, optuna, torch, plotly, jinja2) loaded
by `mbx --help`, `mbx campaign validate` or `mbx campaign plan`."""

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


def arrows_of(name: str, path: Path) -> set[tuple[str, int]]:
    """{(imported mbx module, line)} of one module: every import statement counts, a function-level one and one
    under `if TYPE_CHECKING:` (a type the checker needs is a dependency too) alike."""
    targets = {(own_module(n), line) for n, line in imported_names(name, path) if n.split(".")[0] in PACKAGES}
    return {(t, line) for t, line in targets if t and t != name}


@cache
def arrows() -> dict[str, set[tuple[str, int]]]:
    """module → {(imported mbx module, line)}, function-level and typing-only imports included."""
    return {name: arrows_of(name, path) for name, path in modules().items()}


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


def section_imports(found: dict[str, Path]) -> list[str]:
    """Where a module of `found` imports a report section's module (reports/sections/<name>.py) or spells its
    dotted name: only reports/index_sections.py loads one, by the name of its file."""
    out = []
    for name, path in found.items():
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for imported, line in imported_names(name, path):
            if imported.startswith("reports.sections."):
                out.append(f"{where}:{line} imports {imported}")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and str(node.value).startswith("reports.sections."):
                out.append(f"{where}:{node.lineno} names {node.value}")
    return sorted(out)


def test_a_report_section_is_one_module_that_nothing_imports() -> None:
    """ARCHITECTURE.md, "Where a new part goes": a section of the report's index page is one module of
    reports/sections/ with its template beside it; no module imports it by name (not even another section: what
    sections share lives in reports/index_data.py), and each registers the section it is named after."""
    from reports import index_sections

    assert section_imports(modules()) == []
    shipped = {name.rpartition(".")[2] for name in modules() if name.startswith("reports.sections.")}
    assert {s.name for s in index_sections.every_section()} == shipped and len(shipped) >= 10
    assert all((ROOT / "reports" / "sections" / s.template).is_file() for s in index_sections.sections())


@pytest.mark.parametrize("code", ["from reports.sections.best import Best", "import reports.sections.cells",
                                  "from reports.sections import plots",
                                  'importlib.import_module("reports.sections.parity")'])  # fmt: skip
def test_each_way_of_importing_a_section_is_found(tmp_path: Path, code: str) -> None:
    path = tmp_path / "mod.py"
    path.write_text(code + "\n")
    assert len(section_imports({"reports.somewhere": path})) == 1


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
    """Strongly connected groups of more than one module (Tarjan), function-level and typing-only imports
    counted."""
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


def test_no_import_cycles_counting_function_level_and_typing_imports() -> None:
    assert cycles() == []


def test_typing_only_and_function_level_imports_are_arrows(tmp_path: Path) -> None:
    """An import under `if TYPE_CHECKING:` is an arrow like any other: the layer order and the cycle check see it."""
    path = tmp_path / "kind.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from orchestrator.run.store import Store\n"
                    "def f():\n    from orchestrator.spec import campaign\n")
    found = arrows_of("orchestrator.trainers.kind", path)
    assert found == {("orchestrator.run.store", 3), ("orchestrator.spec.campaign", 5)}


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
     ("campaign", "plan", "campaigns/quickstart.yaml"),
     ("campaign", "validate", "campaigns/seed001_checkpoint_parity.yaml")],  # the parity kind's module loaded
    ids=["help", "campaign-help", "validate", "plan", "validate-parity"],
)  # fmt: skip
def test_login_commands_load_no_heavy_library(args: tuple[str, ...]) -> None:
    assert loaded(*args) == []


# orchestrator/ by role, lowest first (ARCHITECTURE.md): a package imports only from its own layer and below, typing
# imports included.
LAYERS = ("orchestrator.errors", "orchestrator.owned_dirs", "orchestrator.rows", "orchestrator.spec",
          "orchestrator.trainers", "orchestrator.run", "orchestrator.judge", "orchestrator.flow", "orchestrator.cli",
          "orchestrator.__main__")  # fmt: skip


def layer_of(module: str) -> int | None:
    return next((i for i, top in enumerate(LAYERS) if module == top or module.startswith(top + ".")), None)


def test_the_orchestrator_top_level_holds_only_its_role_packages() -> None:
    top = {p.name for p in (ROOT / "orchestrator").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert top == {"__init__.py", "__main__.py", "errors.py", "owned_dirs.py", "rows.py", "spec", "trainers", "run",
                   "judge", "flow", "cli"}  # fmt: skip


def test_no_orchestrator_package_imports_a_higher_one() -> None:
    """Typing-only imports included: a module that names a higher layer's type depends on that layer."""
    upward = []
    for name, targets in arrows().items():
        mine = layer_of(name)
        for target, line in targets if mine is not None else ():
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{modules()[name].relative_to(ROOT)}:{line} ({LAYERS[mine]}) imports {target}")
    assert sorted(upward) == []


# A kind's name may stand outside its own module only here, each for its reason.
KIND_NAMED_ELSEWHERE = {
    "orchestrator/rows.py": "DEFAULT_KIND, the kind of a campaign whose `trainer:` names none",
    "orchestrator/run/store.py": "the schema-1 migration's frozen list of the kinds that existed then",
}


def kind_literals(tree: ast.AST, names: set[str]) -> Iterator[tuple[int, str]]:
    """(line, what) where code names a trainer kind: compares a kind with a name, lists two or more kinds, types
    a field `Literal[<kind>]`, or gives a kind field one as its value (`trainer_kind="bundled"`, `{"kind": ...}`)."""
    kindish = ("kind", "trainer_kind")

    def named(node: ast.AST | None) -> bool:  # a kind's name, or one of an `a if c else b` / `a or b`
        if isinstance(node, ast.IfExp):
            return named(node.body) or named(node.orelse)
        if isinstance(node, ast.BoolOp):
            return any(map(named, node.values))
        return isinstance(node, ast.Constant) and node.value in names

    def about_kind(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and "kind" in n.id or isinstance(n, ast.Attribute) and "kind" in n.attr
                   or isinstance(n, ast.Constant) and n.value in kindish for n in ast.walk(node))  # fmt: skip

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr in kindish for s in sides) and any(map(named, sides)):
                yield node.lineno, "compares a kind with a name"
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and sum(map(named, node.elts)) > 1:
            yield node.lineno, "lists kinds"
        elif isinstance(node, ast.Dict) and sum(map(named, node.keys)) > 1:
            yield node.lineno, "lists kinds"
        elif isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value in kindish and named(v)
            for k, v in zip(node.keys, node.values, strict=True)
        ):
            yield node.lineno, "gives a kind field a kind's name"
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
            if any(named(n) for n in ast.walk(node.slice)):
                yield node.lineno, "types a field as a kind"
        elif isinstance(node, ast.keyword) and node.arg in kindish and named(node.value):
            yield node.value.lineno, "gives a kind field a kind's name"
        elif isinstance(node, ast.AnnAssign) and ast.unparse(node.target).split(".")[-1] in kindish:
            if named(node.value):
                yield node.lineno, "gives a kind field a kind's name"
        elif isinstance(node, ast.BoolOp) and named(node) and about_kind(node):
            yield node.lineno, "defaults a kind"
        elif isinstance(node, ast.Call) and any(map(named, node.args)) and any(map(about_kind, node.args)):
            yield node.lineno, "defaults a kind"


def test_no_module_but_a_kinds_own_names_it() -> None:
    """A kind's name, schema and differences live in its module, orchestrator/trainers/kinds/<kind>.py
    (ARCHITECTURE.md, "Where a new part goes"): no other login-side module branches on a kind's name, lists
    the kinds or spells a kind's schema."""
    from orchestrator.trainers import registry

    names = set(registry.names())
    assert {"bundled", "command"} <= names
    found = []
    for name, path in modules().items():
        relative = str(path.relative_to(ROOT))
        own = name.startswith("orchestrator.trainers.kinds.")
        login_side = name.split(".")[0] in ("orchestrator", "reports", "launchers")
        if own or relative in KIND_NAMED_ELSEWHERE or not login_side:
            continue
        named = set(kind_literals(ast.parse(path.read_text()), names))
        found += [f"{relative}:{line} {what}" for line, what in named]
    assert found == []


@pytest.mark.parametrize(
    "code",
    ['if cell.trainer_kind == "command": pass', 'KINDS = ("bundled", "command")',
     'class T(BaseModel):\n    kind: Literal["command"]', 'Point(trainer_kind="bundled")',
     'spec = {"trainer": {"kind": "bundled"}}', 'class P:\n    trainer_kind: str = "bundled"',
     'CellRow(trainer_kind="command" if argv else "bundled")', 'model = SCHEMAS.get(kind or "bundled")',
     'kind = section.get("kind", "bundled")'],
)  # fmt: skip
def test_each_way_of_naming_a_kind_is_found(code: str) -> None:
    assert len(set(kind_literals(ast.parse(code), {"bundled", "command"}))) == 1


def test_every_kinds_module_registers_its_kind() -> None:
    """Each module of orchestrator/trainers/kinds/ registers the kind it is named after (registry.get refuses
    one that does not)."""
    from orchestrator.trainers import registry

    for name in registry.names():
        assert registry.get(name).name == name and registry.get(name).Section.model_fields["kind"].annotation


# The modules that import by a computed name, each a seam the static import rules cannot see, and what it loads.
IMPORTS_BY_NAME = {
    "orchestrator.spec.trainer_section": "a trainer kind's module, orchestrator/trainers/kinds/<kind>.py",
    "orchestrator.spec.verdict_section": "a verdict kind's module, orchestrator/judge/kinds/<kind>.py",
    "orchestrator.cli.app": "a CLI noun's module when its command runs, orchestrator/cli/<noun>.py",
    "launchers.registry": "a launcher backend's module, launchers/backends/<name>.py",
    "reports.index_sections": "a section of the report's index page, reports/sections/<name>.py",
    "trainer.bridge_entry": "Megatron-Bridge's recipe module of a model family",
    "trainer.te_support": "Transformer Engine, when it is installed",
}


def test_only_the_documented_seams_import_by_name() -> None:
    """An import by a computed name (importlib.import_module, __import__) is an arrow the layer and cycle checks
    do not see: only the registries that find their parts by name may make one."""
    found = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = node.func if isinstance(node, ast.Call) else None
            spelled = ast.unparse(called) if called is not None else ""
            if spelled.endswith(("import_module", "__import__")):
                found.add(name)
    assert found == set(IMPORTS_BY_NAME)


# ---- the verdict-kind seam (ARCHITECTURE.md, "Where a new part goes": a verdict kind) --------------------------
# Parity's own modules besides orchestrator/judge/kinds/parity.py: its section and sides (spec/parity.py, which
# orchestrator/trainers/ turns into sweep factors), its statistics (judge/parity_verdicts.py, parity_noise.py).
VERDICT_KIND_PARTS = {"parity": {"orchestrator.spec.parity", "orchestrator.judge.parity_verdicts",
                                 "orchestrator.judge.parity_noise"}}  # fmt: skip
SEAM_LAYERS = ("orchestrator.judge", "orchestrator.flow", "orchestrator.cli")  # through verdict_kinds only


def kind_named(tree: ast.AST, kind: str) -> Iterator[tuple[int, str]]:
    """(line, what) where code names verdict kind `kind` itself: its campaign section or view records as an
    attribute (`campaign.parity`, `view.parity`), its table through the store (`store.record_parity`), its name
    as a string (`spec.get("parity")`); docstrings and comments are prose, not names."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in (kind, f"record_{kind}"):
            yield node.lineno, f"names .{node.attr}"
        elif isinstance(node, ast.Constant) and node.value == kind and id(node) not in docstrings:
            yield node.lineno, f"spells {kind!r}"


def test_nothing_but_a_verdict_kinds_module_names_its_internals() -> None:
    """A verdict kind is orchestrator/judge/kinds/<kind>.py: nothing imports that module (the registry finds it by
    name), only it (and its own parts) imports the kind's parts, and no module of judge/, flow/ or cli/ names
    the kind (its section, its records, its table, its name): they iterate orchestrator/judge/verdict_kinds.py."""
    from orchestrator.judge import verdict_kinds

    assert set(VERDICT_KIND_PARTS) <= set(verdict_kinds.names())
    found = []
    for name, path in modules().items():
        relative = str(path.relative_to(ROOT))
        for kind in verdict_kinds.names():
            own = {f"orchestrator.judge.kinds.{kind}", *VERDICT_KIND_PARTS.get(kind, ())}
            if name in own:
                continue
            for target, line in arrows()[name]:
                if target == f"orchestrator.judge.kinds.{kind}" or (
                    target in own and name.startswith(SEAM_LAYERS)
                ):
                    found.append(f"{relative}:{line} imports {target}")
            if name.startswith(SEAM_LAYERS) and not name.startswith("orchestrator.judge.kinds."):
                named = kind_named(ast.parse(path.read_text()), kind)
                found += [f"{relative}:{line} {what}" for line, what in named]
    assert sorted(found) == []


def test_each_way_of_naming_a_verdict_kind_is_found() -> None:
    codes = ["campaign.parity.toggle", "view.parity", "store.record_parity(name, pairs)", 'spec.get("parity")',
             'verdicts = {"parity": []}']  # fmt: skip
    for code in codes:
        assert len(list(kind_named(ast.parse(code), "parity"))) == 1, code
    prose = 'def f():\n    """The parity pairs."""\n    # parity\n'
    assert list(kind_named(ast.parse(prose), "parity")) == []
