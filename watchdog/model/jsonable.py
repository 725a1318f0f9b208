"""The one JSON sanitiser: every value that leaves the daemon as JSON (REST, alerts, logs, the event
store, evidence bundles) goes through :func:`jsonable` (pure)."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any


def jsonable(value: Any) -> Any:
    """A JSON-safe deep copy: non-finite floats become None, enums their value, mapping keys strings,
    tuples/sets lists, bytes text (UTF-8, bad bytes replaced), any other object its ``str``."""
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k.value if isinstance(k, enum.Enum) else k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def finite_number(value: object) -> float | None:
    """A number read back from JSON (a document, the store): a finite int or float as a float, else
    None - a bool, a string, NaN or infinity is no number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
