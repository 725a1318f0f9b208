"""Read parsed TOML tables into frozen config dataclasses, reporting every problem with file, line and key.

The dataclass is the schema. A field's annotation gives its type - ``int``, ``float``, ``bool``, ``str``,
``Path`` (relative to the file's directory), ``Literal[...]``, an ``Enum``, ``tuple[X, ...]`` or
``tuple[X, Y]``, ``X | None`` and a nested dataclass (a sub-table) - and :func:`setting` adds the rest
to its metadata: bounds (``ge``, ``gt``, ``le``, ``lt``), ``choices`` known only at run time, a
``parse`` function for anything else, the ``expected`` text and a one-line ``doc``. The default is
written once, on the field; a field without one is required. :func:`derived` marks a field the file
cannot set (the component fills it from other values).

A :class:`Reader` checks one file. ``read(Cls, table, "section")`` returns the dataclass, or ``None``
when that table had a problem; either way it goes on, so one run collects every problem: unknown keys
(with a did-you-mean), wrong types, values out of range, missing required keys, and whatever the
caller adds with :meth:`Reader.problem` for rules across keys. :meth:`Reader.raise_if_any` raises one
:class:`SchemaError` listing them all, one a line::

    job.toml:7: data.seq_len: expected an integer >= 2, got 0
    job.toml:12: cluster.lanucher: unknown key (did you mean 'launcher'?)

``tomllib`` gives no positions, so :class:`TomlLines` scans the text for ``[section]`` headers and
``key =`` lines; a missing key points at its section's header. Values that come from elsewhere (an
environment variable) name their origin instead: ``origins={"period_s": "GPU_WATCHDOG_DAEMON__PERIOD_S"}``.

Standard library only, pure (no I/O: the caller reads the file and passes its text).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

__all__ = [
    "MISSING",
    "Invalid",
    "Problem",
    "Reader",
    "SchemaError",
    "TomlLines",
    "derived",
    "describe",
    "setting",
    "show",
]

T = TypeVar("T")
SCHEMA = "config_schema"  # the metadata key of a field's rule


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a key the table does not have


class Invalid(ValueError):
    """Raised by a ``parse`` function: ``expected`` says what would have been accepted."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


@dataclass(frozen=True)
class Rule:
    """What :func:`setting` stores in a field's metadata."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    nonempty: bool = False
    parse: Callable[[Any], Any] | None = None
    expected: str = ""
    doc: str = ""
    derived: bool = False
    keys: tuple[str, ...] | None = None  # a ``Mapping[str, X]`` table's allowed keys (None: any)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Iterable[Any] | None = None,
    nonempty: bool = False,
    parse: Callable[[Any], Any] | None = None,
    expected: str = "",
    doc: str = "",
    keys: Iterable[str] | None = None,
) -> Any:
    """A dataclass field with its checks. ``parse(value)`` replaces the type check: it returns the value
    to store or raises :class:`Invalid`. ``expected`` overrides the generated "expected ..." text.
    ``keys`` are the keys a ``Mapping[str, X]`` table may have (each value is checked against ``X`` and
    the bounds, each problem reported at ``field.key``)."""
    rule = Rule(
        ge=ge,
        gt=gt,
        le=le,
        lt=lt,
        choices=tuple(choices) if choices is not None else None,
        nonempty=nonempty,
        parse=parse,
        expected=expected,
        doc=doc,
        keys=tuple(keys) if keys is not None else None,
    )
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata={SCHEMA: rule})
    return dataclasses.field(default=default, metadata={SCHEMA: rule})


def derived(default: Any = None, *, doc: str = "") -> Any:
    """A field the file cannot set: the component fills it (``dataclasses.replace``) after reading."""
    return dataclasses.field(default=default, metadata={SCHEMA: Rule(derived=True, doc=doc)})


def _rule(f: dataclasses.Field[Any]) -> Rule:
    rule = f.metadata.get(SCHEMA)
    return rule if isinstance(rule, Rule) else Rule()


def show(value: Any) -> str:
    """A value as an error message prints it, the way TOML writes it: strings in double quotes,
    booleans as ``true``/``false``, tables and arrays summarised; long text cut."""
    if value is MISSING:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= 80 else text[:76] + '..."'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        text = "[" + ", ".join(show(v) for v in value[:4]) + (", ...]" if len(value) > 4 else "]")
        return text if len(text) <= 80 else f"an array of {len(value)}"
    return type(value).__name__


@dataclass(frozen=True)
class Problem:
    """One problem: where (``origin`` - a file or an environment variable - and its line), which key,
    and what is wrong."""

    origin: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.origin}:{self.line}" if self.line is not None else self.origin
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class SchemaError(ValueError):
    """Every problem a configuration had; ``str()`` lists them one a line."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def toml_syntax_problem(origin: str, error: ValueError, what: str = "invalid TOML") -> Problem:
    """A ``tomllib.TOMLDecodeError`` in the ``file:line:`` form of every other problem: tomllib's
    trailing "(at line L, column C)" becomes the line, and "(column C)" stays in the message."""
    text = str(error)
    found = _TOML_AT.search(text)
    if found is None:
        return Problem(origin, None, "", f"{what}: {text}")
    message = f"{text[: found.start()]} (column {found.group(2)})"
    return Problem(origin, int(found.group(1)), "", f"{what}: {message}")


# ------------------------------------------------------------------------------------- line locator
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]#]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*'))*)\s*="""
)
_PART = re.compile(r"""[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*'""")


def _parts(dotted: str) -> list[str]:
    return [p[1:-1] if p[:1] in "\"'" else p for p in _PART.findall(dotted)]


class TomlLines:
    """Line numbers (1-based) of the tables and keys in a TOML text, by dotted key
    (``data.seq_len``; the n-th ``[[alerts.sinks]]`` is ``alerts.sinks[n]``).

    A scan, not a parser: it skips multi-line strings and arrays, and is only ever asked about a text
    ``tomllib`` already accepted. A key it cannot place (an inline table's member) gets its nearest
    enclosing key's line."""

    def __init__(self, text: str = "") -> None:
        self._lines: dict[str, int] = {}
        self._scan(text)

    def _scan(self, text: str) -> None:
        table: list[str] = []
        counts: dict[str, int] = {}
        in_string: str | None = None  # the closing quotes of a multi-line string we are inside
        depth = 0  # open brackets of a multi-line array value
        for number, line in enumerate(text.splitlines(), start=1):
            if in_string is not None:
                if in_string in line:
                    in_string = None
                continue
            if depth > 0:
                depth += _bracket_balance(line)
                continue
            header = _HEADER.match(line)
            if header is not None:
                name = ".".join(_parts(header.group(2)))
                if header.group(1) == "[[":
                    index = counts.get(name, 0)
                    counts[name] = index + 1
                    name = f"{name}[{index}]"
                table = [name]
                self._lines.setdefault(name, number)
                continue
            key = _KEY.match(line)
            if key is None:
                continue
            dotted = ".".join([*table, *_parts(key.group(1))])
            self._lines.setdefault(dotted, number)
            value = line[key.end() :]
            for quotes in ('"""', "'''"):
                if value.count(quotes) % 2 == 1:
                    in_string = quotes
            if in_string is None:
                depth = max(0, _bracket_balance(value))

    def line(self, dotted: str) -> int | None:
        """The line of ``dotted``, else of its nearest enclosing key or table that has one."""
        parts = dotted.split(".")
        while parts:
            found = self._lines.get(".".join(parts))
            if found is not None:
                return found
            parts.pop()
        return None


def _bracket_balance(text: str) -> int:
    """Opened minus closed brackets outside strings and comments (enough for array values)."""
    balance, quote = 0, ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch == "[":
            balance += 1
        elif ch == "]":
            balance -= 1
    return balance


# ------------------------------------------------------------------------------------------- types
def describe(annotation: Any, rule: Rule = Rule()) -> str:
    """What a value of this type and rule looks like, for "expected ..."."""
    if rule.expected:
        return rule.expected
    if rule.choices is not None:
        return "one of " + ", ".join(str(c) for c in rule.choices)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return describe(rest[0], rule) if len(rest) == 1 else " or ".join(describe(a) for a in rest)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in annotation)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"an array of {_plural(describe(args[0], rule))}"
        return f"an array of {len(args)}: " + ", ".join(describe(a, rule) for a in args)
    if dataclasses.is_dataclass(annotation):
        return "a table"
    if origin in (dict, Mapping):
        return f"a table of {_plural(describe(args[1], rule))}" if len(args) == 2 else "a table"
    base = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a non-empty string" if rule.nonempty else "a string",
        Path: "a path",
    }.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return base + _bounds(rule)


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            head, _, tail = text[len(article) :].partition(" ")
            return f"{head}s {tail}".rstrip()
    return text


def _bounds(rule: Rule) -> str:
    if rule.ge is not None and rule.le is not None:
        return f" between {_num(rule.ge)} and {_num(rule.le)}"
    out = []
    for op, bound in ((">=", rule.ge), (">", rule.gt), ("<=", rule.le), ("<", rule.lt)):
        if bound is not None:
            out.append(f"{op} {_num(bound)}")
    return (" " + " and ".join(out)) if out else ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


class _Bad(Exception):
    """A value that does not fit (internal: carries the expected text)."""

    def __init__(self, expected: str) -> None:
        self.expected = expected


class _Reported(_Bad):
    """A nested table whose problems are already recorded (nothing more to say about its key)."""

    def __init__(self) -> None:
        super().__init__("")


class Reader:
    """Collects the problems of one configuration source.

    ``origin`` names the file in messages, ``text`` (its content) gives the lines, ``base_dir`` anchors
    relative paths (default: the file's directory), ``show`` prints offending values."""

    def __init__(
        self,
        origin: str | Path,
        text: str = "",
        *,
        base_dir: Path | None = None,
        show: Callable[[Any], str] = show,
    ) -> None:
        self.origin = str(origin)
        self.lines = TomlLines(text)
        self.base_dir = base_dir if base_dir is not None else Path(origin).resolve().parent
        self.show = show
        self.problems: list[Problem] = []

    # ------------------------------------------------------------------------------- problems
    def problem(self, key: str, message: str, *, origin: str | None = None, line: int | None = None) -> None:
        """Add a problem at ``key`` (its line is looked up unless given or the origin is not the file)."""
        if origin is None or origin == self.origin:
            origin, line = self.origin, line if line is not None else self.lines.line(key)
        self.problems.append(Problem(origin, line, key, message))

    def expected(self, key: str, expected: str, actual: Any, *, origin: str | None = None) -> None:
        """``key: expected <expected>, got <actual>``."""
        self.problem(key, f"expected {expected}, got {self.show(actual)}", origin=origin)

    def unknown(
        self, key: str, known: Iterable[str], *, what: str = "key", origin: str | None = None
    ) -> None:
        """``key: unknown key (did you mean 'x'?)``, else the known ones."""
        known = sorted(known)
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
        self.problem(key, f"unknown {what}{hint}", origin=origin)

    def raise_if_any(self, error: Callable[[Sequence[Problem]], Exception] = SchemaError) -> None:
        """Raise ``error(problems)`` when there is any (in file order; problems elsewhere after)."""
        if self.problems:
            ordered = sorted(
                self.problems,
                key=lambda p: (p.origin != self.origin, p.line is None, p.line or 0),
            )
            raise error(ordered)

    # ----------------------------------------------------------------------------------- reading
    def read(
        self,
        cls: type[T],
        table: Any,
        section: str,
        *,
        origins: Mapping[str, str] | None = None,
    ) -> T | None:
        """``table`` (a parsed TOML table) as a ``cls``; ``None`` if it had a problem (each recorded).
        ``section`` is the dotted name keys are reported under; ``origins`` maps a key to the source it
        came from where that is not the file."""
        origins = origins or {}
        if not isinstance(table, dict):
            self.expected(section, f"a table ([{section}])", table)
            return None
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        settable = {name for name, f in fields.items() if not _rule(f).derived}
        values: dict[str, Any] = {}
        ok = True
        for key, value in table.items():
            dotted, origin = f"{section}.{key}", origins.get(key)
            if key not in settable:
                self.unknown(dotted, settable, origin=origin)
                ok = False
                continue
            rule = _rule(fields[key])
            try:
                values[key] = self._value(hints[key], rule, value, dotted, origins, where=origin)
            except _Reported:
                ok = False
            except _Bad as bad:
                self.expected(dotted, bad.expected, value, origin=origin)
                ok = False
        for name in sorted(settable - set(table)):
            f = fields[name]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                dotted = f"{section}.{name}"
                self.problem(
                    dotted,
                    f"expected {describe(hints[name], _rule(f))} (required), got nothing",
                    line=self.lines.line(section),
                )
                ok = False
        if not ok:
            return None
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:  # a __post_init__ refusing a combination
            self.problem(section, str(exc))
            return None

    def _value(
        self,
        annotation: Any,
        rule: Rule,
        value: Any,
        dotted: str,
        origins: Mapping[str, str],
        *,
        where: str | None = None,
    ) -> Any:
        if rule.parse is not None:
            try:
                return rule.parse(value)
            except Invalid as exc:
                raise _Bad(rule.expected or exc.expected) from None
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (Union, types.UnionType):
            options = [a for a in args if a is not type(None)]
            for i, option in enumerate(options):  # X | None: None is absence (TOML has no null)
                try:
                    return self._value(option, rule, value, dotted, origins)
                except _Reported:
                    raise
                except _Bad:
                    if i == len(options) - 1:
                        raise _Bad(describe(annotation, rule)) from None
            raise _Bad(describe(annotation, rule))
        if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
            if not isinstance(value, dict):
                raise _Bad(f"a table ([{dotted}])")
            built = self.read(annotation, value, dotted, origins={})
            if built is None:
                raise _Reported
            return built
        if origin in (dict, Mapping) and len(args) == 2:
            return self._mapping(args[1], rule, value, dotted, origins, where=where)
        if rule.choices is not None:
            if value not in rule.choices or isinstance(value, bool) != any(
                isinstance(c, bool) for c in rule.choices
            ):
                raise _Bad(describe(annotation, rule))
            return value
        if origin is Literal:
            if not any(value == a and type(value) is type(a) for a in args):
                raise _Bad(describe(annotation, rule))
            return value
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            for member in annotation:
                if member.value == value and type(member.value) is type(value):
                    return member
            raise _Bad(describe(annotation, rule))
        if origin is tuple:
            if not isinstance(value, list):
                raise _Bad(describe(annotation, rule))
            if len(args) == 2 and args[1] is Ellipsis:
                kinds = [args[0]] * len(value)
            elif len(args) == len(value):
                kinds = list(args)
            else:
                raise _Bad(describe(annotation, rule))
            try:
                return tuple(
                    self._value(
                        k, rule, v, f"{dotted}[{i}]" if dataclasses.is_dataclass(k) else dotted, origins
                    )
                    for i, (k, v) in enumerate(zip(kinds, value, strict=True))
                )
            except _Reported:
                raise
            except _Bad:
                raise _Bad(describe(annotation, rule)) from None
        return self._scalar(annotation, rule, value)

    def _mapping(
        self, kind: Any, rule: Rule, value: Any, dotted: str, origins: Mapping[str, str], *, where: str | None
    ) -> Mapping[str, Any]:
        """A ``{key = value}`` table: every unknown key and bad value reported at ``dotted.key``."""
        if not isinstance(value, dict):
            raise _Bad(describe(Mapping[str, kind], rule))
        out: dict[str, Any] = {}
        ok = True
        item_rule = dataclasses.replace(rule, keys=None, expected="")
        for key, item in value.items():
            at = f"{dotted}.{key}"
            if rule.keys is not None and key not in rule.keys:
                self.unknown(at, rule.keys, origin=where)
                ok = False
                continue
            try:
                out[key] = self._value(kind, item_rule, item, at, origins, where=where)
            except _Reported:
                ok = False
            except _Bad as bad:
                self.expected(at, bad.expected, item, origin=where)
                ok = False
        if not ok:
            raise _Reported
        return types.MappingProxyType(out)

    def _scalar(self, annotation: Any, rule: Rule, value: Any) -> Any:
        bad = _Bad(describe(annotation, rule))
        if annotation is bool:
            if not isinstance(value, bool):
                raise bad
            return value
        if annotation is int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad
            out: Any = value
        elif annotation is float:
            if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                raise bad
            out = float(value)
        elif annotation is str:
            if not isinstance(value, str) or (rule.nonempty and not value.strip()):
                raise bad
            return value
        elif annotation is Path:
            if not isinstance(value, str) or not value.strip():
                raise bad
            p = Path(value).expanduser()
            return p if p.is_absolute() else self.base_dir / p
        else:
            raise TypeError(f"config_schema: unsupported annotation {annotation!r}")
        if (
            (rule.ge is not None and out < rule.ge)
            or (rule.gt is not None and out <= rule.gt)
            or (rule.le is not None and out > rule.le)
            or (rule.lt is not None and out >= rule.lt)
        ):
            raise bad
        return out
