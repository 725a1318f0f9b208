"""No module over 800 lines and no function over 120 lines in ``watchdog/`` and ``trainer/`` (issue 29):
past those sizes a module holds several concerns and a function several steps, and both are split by
concern. Counted from the source (AST): a function's lines run from its ``def`` to its last line,
docstring and nested functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("watchdog", "trainer")
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120

#: Being split elsewhere; each entry names who removes it. Remove an entry when its module is split.
PENDING: frozenset[str] = frozenset(
    {
        "watchdog/telemetry/sim.py",  # engineer 30 splits the simulation (issue 29)
    }
)


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def long_modules() -> list[str]:
    out = []
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        rel = path.relative_to(ROOT).as_posix()
        if lines > MAX_MODULE_LINES and rel not in PENDING:
            out.append(f"{rel}: {lines} lines")
    return out


def long_functions_in(path: Path) -> list[tuple[int, str, int]]:
    """(line, name, lines) of each function of ``path`` longer than :data:`MAX_FUNCTION_LINES`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append((node.lineno, node.name, lines))
    return out


def long_functions() -> list[str]:
    return [
        f"{path.relative_to(ROOT).as_posix()}:{line} {name}: {lines} lines"
        for path in _modules()
        for line, name, lines in long_functions_in(path)
    ]


def test_no_module_over_800_lines() -> None:
    assert long_modules() == []


def test_no_function_over_120_lines() -> None:
    assert long_functions() == []


def test_the_pending_list_names_only_modules_still_too_long() -> None:
    """An entry of :data:`PENDING` whose module was split (or removed) must go."""
    for rel in PENDING:
        path = ROOT / rel
        assert path.is_file() and len(path.read_text(encoding="utf-8").splitlines()) > MAX_MODULE_LINES, rel


def test_the_checker_finds_a_long_function_nested_or_not(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "m.py"
    path.write_text(f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions_in(path) == [(6, "long", MAX_FUNCTION_LINES + 1)]
