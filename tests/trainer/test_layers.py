"""The trainer's layers (``trainer/``, import name ``ft_trainer``): a lower layer never imports a higher
one, and nothing in the wheel imports the dev helpers.

Lowest first:

0. ``planning`` (model presets, estimates, the packing plan, equalize, cluster) - pure numbers and
   values (the progress writer is ``gpu_triage.contract``'s, imported from there);
1. ``config`` - the job file, read into the components' section dataclasses;
2. ``data`` - corpus, tokenizer, token cache, a rank's batches;
3. ``gate`` (the pre-launch check) and ``train`` (torch and DeepSpeed) - side by side, neither imports
   the other;
4. ``cli`` - the commands;
5. ``devtools`` - test, benchmark and demo helpers (not in the wheel): may import anything, imported by
   nothing above.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a dependency a reader must
know about is one whether it runs at import time or later.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
PACKAGE = "ft_trainer"
LAYERS: dict[str, int] = {
    "planning": 0,
    "config": 1,
    "data": 2,
    "gate": 3,
    "train": 3,
    "cli": 4,
    "devtools": 5,
    "__init__": 0,
}
SIDE_BY_SIDE = {frozenset({"gate", "train"})}


def _part(module: str) -> str:
    """``ft_trainer.data.cache`` -> ``data``; ``ft_trainer`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(source: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, imported ft_trainer module) for every import in ``source`` (or ``text`` as if it were that
    file), relative ones resolved."""
    rel = source.relative_to(TRAINER).with_suffix("")
    package = [PACKAGE, *rel.parts[:-1]]
    out = []
    code = source.read_text() if text is None else text
    for node in ast.walk(ast.parse(code, filename=str(source))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] != PACKAGE:
                continue
            if module == PACKAGE:  # from ft_trainer import x: x is a module, or a name of __init__
                out += [
                    (node.lineno, f"{PACKAGE}.{a.name}" if _is_module(a.name) else PACKAGE)
                    for a in node.names
                ]
            else:
                out.append((node.lineno, module))
    return sorted(out)


def _is_module(name: str) -> bool:
    return (TRAINER / f"{name}.py").is_file() or (TRAINER / name / "__init__.py").is_file()


def _sources() -> list[Path]:
    return sorted(TRAINER.rglob("*.py"))


def test_every_part_has_a_layer() -> None:
    parts = {_part(".".join([PACKAGE, *s.relative_to(TRAINER).with_suffix("").parts])) for s in _sources()}
    assert parts <= set(LAYERS), f"give these a layer: {sorted(parts - set(LAYERS))}"


@pytest.mark.parametrize("source", _sources(), ids=lambda s: str(s.relative_to(TRAINER)))
def test_no_lower_layer_imports_a_higher_one(source: Path) -> None:
    own = _part(".".join([PACKAGE, *source.relative_to(TRAINER).with_suffix("").parts]))
    wrong = []
    for line, module in _imports(source):
        other = _part(module)
        if other == own or other == "__init__":
            continue
        if LAYERS[other] > LAYERS[own] or frozenset({own, other}) in SIDE_BY_SIDE:
            wrong.append(
                f"{source.relative_to(TRAINER)}:{line}: {own} (layer {LAYERS[own]}) imports {module}"
            )
    assert wrong == []


def test_the_check_sees_a_violation() -> None:
    """The walker finds imports in functions, under TYPE_CHECKING and relative ones (else the test
    above could pass by finding nothing)."""
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ft_trainer.config import JobConfig\n"
        "def f():\n    from ..train import loop\n    import ft_trainer.cli\n"
        "from ft_trainer import gate\n"
        "from .plan import EpochPlan\n"
    )
    found = _imports(TRAINER / "planning" / "presets.py", code)
    assert [m for _, m in found] == [
        "ft_trainer.config",
        "ft_trainer.train",
        "ft_trainer.cli",
        "ft_trainer.gate",
        "ft_trainer.planning.plan",
    ]
    assert [m for _, m in found if LAYERS[_part(m)] > LAYERS["planning"]] == [m for _, m in found][:4]
