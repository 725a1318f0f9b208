"""Built-in simulation scenarios: TOML data files next to this module.

A scenario scripts N GPUs of one model through phases (training, a checkpoint save, a data stall, the
epoch-end deadlock...). :class:`gpu_triage.telemetry.sim.Scenario` parses them; this module only knows
where they live, so ``--source sim:reference-b300`` and ``--source sim:./my.toml`` both work.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_SCENARIO", "SCENARIO_DIR", "find", "names"]

SCENARIO_DIR = Path(__file__).resolve().parent
#: One node (8 x B300) of the reference job: training, a checkpoint, a data stall, the epoch-end deadlock.
DEFAULT_SCENARIO = "reference-b300"


def names() -> list[str]:
    """Names of the built-in scenarios (file stems), sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def find(name_or_path: str | Path) -> Path:
    """The TOML file for a built-in name (``reference-b300``) or a path to a file.

    A string containing a path separator or ending in ``.toml`` is a path; anything else is a name.
    Raises FileNotFoundError listing the built-in names when neither exists.
    """
    text = str(name_or_path)
    looks_like_path = isinstance(name_or_path, Path) or "/" in text or "\\" in text or text.endswith(".toml")
    if looks_like_path:
        path = Path(text).expanduser()
        if path.is_file():
            return path
        raise FileNotFoundError(f"scenario file {path} does not exist")
    builtin = SCENARIO_DIR / f"{text}.toml"
    if builtin.is_file():
        return builtin
    raise FileNotFoundError(
        f"unknown scenario {text!r}: built-in scenarios are {', '.join(names()) or '(none)'}; "
        "or give a path to a .toml file"
    )
