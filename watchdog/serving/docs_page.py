"""``/docs``: the OpenAPI document as one self-contained HTML page, and the docstrings' reStructuredText
made readable for it and for ``/openapi.json`` (descriptions are Markdown there)."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

_REST_ROLE = re.compile(r":(?:[a-z]+:)+`([^`]+)`")
_REST_LITERAL = re.compile(r"``([^`]+)``")
_MD_CODE = re.compile(r"`([^`]+)`")


def _role_text(found: re.Match[str]) -> str:
    inner = found.group(1).strip()
    if inner.endswith(">") and "<" in inner:  # :ref:`title <target>`
        return inner[: inner.index("<")].strip()
    name = inner[1:].rsplit(".", 1)[-1] if inner.startswith("~") else inner
    return f"`{name}`"


def readable_text(text: str) -> str:
    """A docstring's reStructuredText markup as the Markdown OpenAPI descriptions are read in:
    ``literal`` -> `literal`, :class:`~pkg.mod.Name` -> `Name`, :func:`pkg.f` -> `pkg.f`,
    :ref:`title <target>` -> title, a paragraph's closing ``::`` -> ``:``."""
    text = _REST_ROLE.sub(_role_text, text)
    text = _REST_LITERAL.sub(r"`\1`", text)
    return re.sub(r"::(\s*(?:\n|$))", r":\1", text)


def _code(escaped: str) -> str:
    """Markdown code spans of already escaped text as ``<code>`` elements."""
    return _MD_CODE.sub(r"<code>\1</code>", escaped)


def readable_descriptions(node: Any) -> Any:
    """Every ``description`` string of an OpenAPI document through :func:`readable_text`, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = readable_text(value)
            else:
                readable_descriptions(value)
    elif isinstance(node, list):
        for item in node:
            readable_descriptions(item)
    return node


def offline_docs_html(spec: Mapping[str, Any]) -> str:
    """``/docs``: every endpoint of the OpenAPI document with its summary, as one HTML page that loads
    nothing from anywhere (no script, no stylesheet, no CDN), and a link to ``/openapi.json`` for an
    OpenAPI viewer of your own (Swagger UI, an editor, ``curl``)."""
    esc = html.escape
    info = spec.get("info", {})
    rows = []
    for path, methods in sorted(spec.get("paths", {}).items()):
        for method, op in methods.items():
            summary = op.get("summary") or ""
            doc = (op.get("description") or "").strip().split("\n\n")[0]
            secured = " (bearer token)" if op.get("security") else ""
            rows.append(
                f"<tr><td><code>{esc(method.upper())}</code></td><td><code>{esc(path)}</code></td>"
                f"<td>{esc(summary)}{esc(secured)}<br><small>{_code(esc(doc))}</small></td></tr>"
            )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(str(info.get('title', '')))} API</title></head><body>"
        f"<h1>{esc(str(info.get('title', '')))} {esc(str(info.get('version', '')))}</h1>"
        f"<p>{esc(str(info.get('description', '')))}</p>"
        "<p>The full OpenAPI document: <a href='/openapi.json'>/openapi.json</a> (open it in any OpenAPI "
        "viewer; this page loads nothing from the network, so it works on an air-gapped node).</p>"
        "<table border='1' cellpadding='4'><tr><th>method</th><th>path</th><th>what</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )
