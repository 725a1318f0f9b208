"""The Xid catalog (``xid_catalog.toml``): what an Xid code means, whom it blames, what to do.

The data is one TOML file beside this module, an entry per code of NVIDIA's Xid catalog, each citing
its source. It is validated whole when first loaded (:class:`CatalogError` names the entry and the
key). A code that is not in the catalog is judged :func:`unknown_entry`: blame unknown, action
unknown, the GPU degraded - reported, never dropped.

Xid 154 ("GPU recovery action changed") carries its action in the line; :func:`judge` reads it.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_triage.model.health import Blame, HealthLevel, OperatorAction

CATALOG_FILE = "xid_catalog.toml"

#: The catalog's blame words and whom they blame in a verdict (model.health.Blame).
BLAME_WORDS: dict[str, Blame] = {
    "gpu": Blame.NODE,
    "driver": Blame.NODE,
    "application": Blame.JOB,
    "fabric": Blame.NETWORK,
    "unknown": Blame.UNKNOWN,
}
_KEYS = {
    "code",
    "mnemonic",
    "meaning",
    "nvidia_action",
    "nvidia_investigation",
    "blame",
    "level",
    "action",
    "note",
    "source",
}
_REQUIRED = _KEYS - {"note"}


class CatalogError(ValueError):
    """The catalog file is malformed (the message names the entry and the key)."""


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    meaning: str
    blame_word: str
    """gpu, driver, application, fabric or unknown (the catalog's word)."""
    level: HealthLevel
    action: OperatorAction
    nvidia_action: str = ""
    nvidia_investigation: str = ""
    note: str = ""
    source: str = ""
    """The URL the entry was read from."""
    known: bool = True
    """False for a code not in the catalog."""

    @property
    def blame(self) -> Blame:
        return BLAME_WORDS[self.blame_word]

    def describe(self) -> str:
        """``"Xid 79: GPU has fallen off the bus"``."""
        return f"Xid {self.code}: {self.meaning}"


def unknown_entry(code: int) -> XidEntry:
    """A code the catalog does not list: reported as unknown (blame and action), the GPU degraded."""
    return XidEntry(
        code=code,
        mnemonic="UNKNOWN",
        meaning="not in the Xid catalog",
        blame_word="unknown",
        level=HealthLevel.DEGRADED,
        action=OperatorAction.UNKNOWN,
        known=False,
    )


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise CatalogError(f"{where}: {key}: expected a string, got {value!r}")
    return value


def parse_catalog(data: dict[str, Any], origin: str) -> dict[int, XidEntry]:
    """Validate a decoded catalog; errors name ``origin``, the entry and the key."""
    sources = data.get("sources")
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise CatalogError(f"{origin}: [sources]: expected a table of URLs")
    entries = data.get("xid")
    if not isinstance(entries, list) or not entries:
        raise CatalogError(f"{origin}: [[xid]]: expected a list of entries")
    out: dict[int, XidEntry] = {}
    for i, raw in enumerate(entries):
        where = f"{origin}: xid[{i}]"
        if not isinstance(raw, dict):
            raise CatalogError(f"{where}: expected a table")
        code = raw.get("code")
        if isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 100_000:
            raise CatalogError(f"{where}: code: expected a positive integer, got {code!r}")
        where = f"{origin}: xid {code}"
        unknown = set(raw) - _KEYS
        if unknown:
            raise CatalogError(f"{where}: unknown key(s) {sorted(unknown)}")
        missing = _REQUIRED - set(raw)
        if missing:
            raise CatalogError(f"{where}: missing key(s) {sorted(missing)}")
        if code in out:
            raise CatalogError(f"{where}: listed twice")
        blame = _text(where, "blame", raw["blame"])
        if blame not in BLAME_WORDS:
            raise CatalogError(f"{where}: blame: expected one of {sorted(BLAME_WORDS)}, got {blame!r}")
        try:
            level = HealthLevel(_text(where, "level", raw["level"]))
        except ValueError:
            raise CatalogError(
                f"{where}: level: expected one of {[str(v) for v in HealthLevel]}, got {raw['level']!r}"
            ) from None
        try:
            action = OperatorAction(_text(where, "action", raw["action"]))
        except ValueError:
            raise CatalogError(
                f"{where}: action: expected one of {[str(v) for v in OperatorAction]}, got {raw['action']!r}"
            ) from None
        source = _text(where, "source", raw["source"])
        if source not in sources:
            raise CatalogError(f"{where}: source: {source!r} is not a key of [sources]")
        meaning = _text(where, "meaning", raw["meaning"])
        if not meaning:
            raise CatalogError(f"{where}: meaning: empty")
        out[code] = XidEntry(
            code=code,
            mnemonic=_text(where, "mnemonic", raw["mnemonic"]),
            meaning=meaning,
            blame_word=blame,
            level=level,
            action=action,
            nvidia_action=_text(where, "nvidia_action", raw["nvidia_action"]),
            nvidia_investigation=_text(where, "nvidia_investigation", raw["nvidia_investigation"]),
            note=_text(where, "note", raw.get("note", "")),
            source=sources[source],
        )
    return out


def load_catalog(path: Path | None = None) -> dict[int, XidEntry]:
    """The built-in catalog (cached), or the file at ``path``."""
    if path is None:
        return _builtin()
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise CatalogError(f"{path}: {e}") from None
    return parse_catalog(data, str(path))


@functools.cache
def _builtin() -> dict[int, XidEntry]:
    text = resources.files(__package__).joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    return parse_catalog(tomllib.loads(text), CATALOG_FILE)


def lookup(code: int, catalog: dict[int, XidEntry] | None = None) -> XidEntry:
    """The entry for ``code``; :func:`unknown_entry` when the catalog lacks it."""
    entries = _builtin() if catalog is None else catalog
    return entries.get(code) or unknown_entry(code)


#: Xid 154's recovery actions, as the driver words them, and what they mean here.
_RECOVERY_ACTIONS: tuple[tuple[str, HealthLevel, OperatorAction], ...] = (
    ("node reboot required", HealthLevel.UNHEALTHY, OperatorAction.DRAIN_NODE),
    ("drain and reset", HealthLevel.UNHEALTHY, OperatorAction.RESET_GPU),
    ("gpu reset required", HealthLevel.UNHEALTHY, OperatorAction.RESET_GPU),
    ("drain p2p", HealthLevel.DEGRADED, OperatorAction.DRAIN_NODE),
    ("none", HealthLevel.HEALTHY, OperatorAction.NONE),
)


def judge(code: int, text: str = "", catalog: dict[int, XidEntry] | None = None) -> XidEntry:
    """The entry for one Xid occurrence: the catalog's, except that Xid 154 takes the recovery action
    its line names (``... changed from 0x0 (None) to 0x2 (Node Reboot Required)``: the last one)."""
    entry = lookup(code, catalog)
    if code != 154 or not text:
        return entry
    lowered = text.lower()
    target = lowered.rsplit(" to ", 1)[-1] if " to " in lowered else lowered
    for words, level, action in _RECOVERY_ACTIONS:
        if words in target:
            return replace(entry, level=level, action=action)
    return entry


__all__ = [
    "BLAME_WORDS",
    "CatalogError",
    "XidEntry",
    "judge",
    "load_catalog",
    "lookup",
    "parse_catalog",
    "unknown_entry",
]
