"""The import layers of ``gpu_triage`` (docs/architecture.md): a subpackage imports only from layers
below its own, never from a higher one or a sibling of its layer; the pure layers import no I/O
library; and ``gpu_triage`` never imports ``ft_trainer``.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a lazy import
still ties the lower layer to the higher one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "watchdog"
PACKAGE = "gpu_triage"

#: Lowest first. A package may import its own modules and any package of a lower layer.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"contract", "model"}),
    frozenset({"alerts", "recordings", "integrations"}),
    frozenset({"config", "telemetry", "classify", "signals"}),
    frozenset({"verdicts", "triage", "journal"}),
    frozenset({"actions"}),
    frozenset({"serving"}),
    frozenset({"daemon"}),
    frozenset({"demo"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)

#: What the package's own ``__init__`` defines (it imports nothing, so any layer may read it).
ROOT_NAMES = frozenset({"__version__", "DISTRIBUTION"})

#: Pure layers: decisions from values, time passed in. No hardware, process, network or storage I/O.
PURE_PACKAGES = frozenset({"model", "verdicts", "alerts"})
PURE_MODULES = frozenset(
    {"classify.bands", "classify.hysteresis", "classify.power_table", "classify.tracker"}
)
IO_LIBRARIES = frozenset(
    {
        "pynvml",
        "psutil",
        "fastapi",
        "uvicorn",
        "starlette",
        "sqlite3",
        "httpx",
        "requests",
        "urllib.request",
        "http.client",
        "socket",
        "subprocess",
        "prometheus_client",
        "pyarrow",
    }
)


@dataclass(frozen=True, slots=True)
class Import:
    module: str  # e.g. "verdicts.detector" (relative to the package)
    line: int
    target: str  # fully qualified, e.g. "gpu_triage.signals.processes" or "psutil"


def layer_of(package: str) -> int:
    for index, members in enumerate(LAYERS):
        if package in members:
            return index
    raise KeyError(package)


def subpackage(module: str) -> str:
    """``verdicts.detector`` -> ``verdicts``; a top-level module (``contract``) is its own package."""
    return module.split(".")[0]


def imports_of(path: Path, module: str) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(Import(module, node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PACKAGE:  # from gpu_triage import x: x is a subpackage or module
                out.extend(Import(module, node.lineno, f"{PACKAGE}.{alias.name}") for alias in node.names)
            else:
                out.append(Import(module, node.lineno, node.module))
    return out


def all_imports(package_dir: Path = PACKAGE_DIR) -> list[Import]:
    out: list[Import] = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if not parts:  # the package's own __init__: imports nothing by design
            continue
        out.extend(imports_of(path, ".".join(parts)))
    return out


def layer_violations(imports: list[Import]) -> list[str]:
    problems = []
    for imp in imports:
        if not imp.target.startswith(PACKAGE + "."):
            continue
        own, other = subpackage(imp.module), subpackage(imp.target[len(PACKAGE) + 1 :])
        if own == other or other in ROOT_NAMES:
            continue
        if layer_of(other) >= layer_of(own):
            problems.append(
                f"watchdog/{imp.module.replace('.', '/')}.py:{imp.line}: {own} (layer {layer_of(own)}) "
                f"imports {imp.target} ({other}, layer {layer_of(other)})"
            )
    return problems


def purity_violations(imports: list[Import]) -> list[str]:
    problems = []
    for imp in imports:
        pure = subpackage(imp.module) in PURE_PACKAGES or imp.module in PURE_MODULES
        if pure and any(imp.target == lib or imp.target.startswith(lib + ".") for lib in IO_LIBRARIES):
            problems.append(f"{imp.module}:{imp.line} is pure but imports {imp.target}")
    return problems


def test_every_subpackage_has_a_layer():
    packages = {
        p.name
        for p in PACKAGE_DIR.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    }
    packages = {Path(name).stem for name in packages} - {"__init__"}
    unplaced = sorted(name for name in packages if not any(name in layer for layer in LAYERS))
    assert not unplaced, f"place these in LAYERS (and docs/architecture.md): {unplaced}"


def test_no_package_imports_a_higher_layer_or_a_sibling():
    problems = layer_violations(all_imports())
    assert not problems, "\n".join(problems)


def test_pure_layers_import_no_io_library():
    problems = purity_violations(all_imports())
    assert not problems, "\n".join(problems)


def test_the_watchdog_never_imports_the_trainer():
    offenders = [
        f"{imp.module}:{imp.line}"
        for imp in all_imports()
        if imp.target == "ft_trainer" or imp.target.startswith("ft_trainer.")
    ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from gpu_triage.daemon.loop import Daemon\n", "verdicts (layer 3) imports gpu_triage.daemon.loop"),
        ("def f():\n    from gpu_triage.actions import kill\n", "imports gpu_triage.actions"),
        ("from gpu_triage import journal\n", "imports gpu_triage.journal (journal, layer 3)"),
    ],
)
def test_the_checker_catches_an_upward_import(tmp_path, source, expected):
    """The rule itself can fail: a lower package importing a higher one (or a sibling) is reported."""
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "verdicts" / "__init__.py").write_text("")
    (tmp_path / "verdicts" / "bad.py").write_text(source)
    problems = layer_violations(all_imports(tmp_path))
    assert len(problems) == 1 and expected in problems[0], problems


def test_the_checker_catches_io_in_a_pure_layer(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "bad.py").write_text("import psutil\n")
    assert purity_violations(all_imports(tmp_path)) == ["model.bad:1 is pure but imports psutil"]


# -- import circles and transitive purity ----------------------------------------------------------
def module_names(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package by dotted name relative to it (``daemon.loop``; a package's
    ``__init__`` under the package's name, ``daemon``)."""
    out: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts:
            out[".".join(parts)] = path
    return out


def module_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Which of the package's modules each module imports (every import, lazy and TYPE_CHECKING
    ones included; ``from pkg import mod`` is an import of ``pkg.mod``)."""
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module[len(PACKAGE) + 1 :]  # `from pkg import mod` imports pkg.mod, else pkg
                names = [f"{base}.{a.name}".lstrip(".") for a in node.names]
                targets = [f"{PACKAGE}.{n}" if n in modules else node.module for n in names]
            for target in targets:
                if not target.startswith(PACKAGE + "."):
                    continue
                name = target[len(PACKAGE) + 1 :]
                if name in modules and name != module:
                    graph[module].add(name)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


def test_no_import_circle_inside_the_package():
    """Modules that import each other (even only for type hints) are one module split by file: each
    part must stand on its own, below whatever composes it."""
    circles = import_circles(module_graph())
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_checker_catches_a_circle(tmp_path):
    (tmp_path / "daemon").mkdir()
    (tmp_path / "daemon" / "__init__.py").write_text("")
    (tmp_path / "daemon" / "loop.py").write_text("from gpu_triage.daemon import observe\n")
    (tmp_path / "daemon" / "observe.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpu_triage.daemon.loop import Daemon\n"
    )
    assert import_circles(module_graph(tmp_path)) == [["daemon.loop", "daemon.observe"]]


def io_reached(graph: dict[str, set[str]], package_dir: Path = PACKAGE_DIR) -> dict[str, list[str]]:
    """For each module, the I/O libraries it loads directly or through the package's own modules
    (each as ``lib via a -> b``)."""
    direct: dict[str, set[str]] = {m: set() for m in graph}
    for imp in all_imports(package_dir):
        for lib in IO_LIBRARIES:
            if imp.target == lib or imp.target.startswith(lib + "."):
                direct.setdefault(imp.module, set()).add(lib)
    out: dict[str, list[str]] = {}
    for start in graph:
        seen = {start: [start]}
        queue = [start]
        found: list[str] = []
        while queue:
            m = queue.pop(0)
            found += [f"{lib} via {' -> '.join(seen[m])}" for lib in sorted(direct.get(m, ()))]
            for nxt in sorted(graph.get(m, ())):
                if nxt not in seen:
                    seen[nxt] = [*seen[m], nxt]
                    queue.append(nxt)
        out[start] = found
    return out


def transitive_purity_violations(package_dir: Path = PACKAGE_DIR) -> list[str]:
    graph = module_graph(package_dir)
    problems = []
    for module, found in io_reached(graph, package_dir).items():
        pure = subpackage(module) in PURE_PACKAGES or module in PURE_MODULES
        if pure and found:
            problems.append(f"{module} is pure but loads {found[0]}")
    return sorted(problems)


def test_pure_layers_load_no_io_library_through_other_modules():
    """The purity rule follows imports: a pure module importing a module that imports psutil loads
    psutil as surely as importing it itself."""
    problems = transitive_purity_violations()
    assert not problems, "\n".join(problems)


def test_the_purity_checker_follows_imports(tmp_path):
    for package, source in (
        ("verdicts", "from gpu_triage.signals.processes import ProcessView\n"),
        ("signals", "import psutil\n"),
    ):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / ("fusion.py" if package == "verdicts" else "processes.py")).write_text(source)
    assert transitive_purity_violations(tmp_path) == [
        "verdicts.fusion is pure but loads psutil via verdicts.fusion -> signals.processes"
    ]


# -- no module reads another's private attributes --------------------------------------------------
CHECKED_FOLDERS = (ROOT / "watchdog", ROOT / "trainer")


def _defined_privates(tree: ast.AST) -> set[str]:
    """The ``_names`` a module defines: its functions, classes and class attributes, ``self._x``
    assignments, ``_x=`` keywords (argparse ``set_defaults``) and module-level ``_x`` names."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
    return {name for name in out if name.startswith("_") and not name.startswith("__")}


def private_reads(folders: tuple[Path, ...] = CHECKED_FOLDERS) -> list[str]:
    """``obj._name`` (read or written) in a module where ``_name`` is not its own but another module
    of ours defines it; and ``from ours import _name``."""
    trees = {
        path: ast.parse(path.read_text(), filename=str(path))
        for f in folders
        for path in sorted(f.rglob("*.py"))
    }
    own = {path: _defined_privates(tree) for path, tree in trees.items()}
    ours = set().union(*own.values()) if own else set()
    problems = []
    for path, tree in trees.items():
        where = path.relative_to(path.parents[len(path.relative_to(folders[0].parent).parts) - 1])
        for node in ast.walk(tree):
            name = None
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                    continue
                name = node.attr
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0]
                in (
                    PACKAGE,
                    "ft_trainer",
                )
            ):
                bad = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if bad:
                    problems.append(f"{where}:{node.lineno}: imports {node.module}.{bad[0]}")
                continue
            if name is not None and name not in own[path] and name in ours:
                problems.append(f"{where}:{node.lineno}: {ast.unparse(node)} (another module's private)")
    return problems


def test_no_module_reads_another_modules_private_attributes():
    """A part's ``_fields`` are its own: another module asks it through its public interface (the
    daemon's parts once read and wrote each other's, e.g. observe setting ``d._process_view``)."""
    problems = private_reads()
    assert not problems, "\n".join(problems)


def test_the_private_checker_catches_a_foreign_private(tmp_path):
    pkg = tmp_path / "watchdog"
    pkg.mkdir()
    (pkg / "loop.py").write_text("class Daemon:\n    def __init__(self):\n        self._view = None\n")
    (pkg / "observe.py").write_text("def observe(d):\n    d._view = 1\n    return d._view\n")
    (pkg / "own.py").write_text(
        "class A:\n    def __init__(self):\n        self._x = 1\n    def eq(self, o):\n        return o._x\n"
    )
    assert private_reads((pkg,)) == [
        "watchdog/observe.py:2: d._view (another module's private)",
        "watchdog/observe.py:3: d._view (another module's private)",
    ]
