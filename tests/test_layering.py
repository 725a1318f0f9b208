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
        ("def f():\n    from gpu_triage.actions import kill_targets\n", "imports gpu_triage.actions"),
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
