"""An evidence bundle as one self-contained HTML page: what an on-call opens first.

``report.html`` sits in the bundle directory beside what it summarises (the capture writes it last;
``gpu-watchdog evidence-report BUNDLE_DIR`` writes it again for any bundle, older ones included). It
shows the job, verdict and node; whom the verdict blames (the job, the node, the network) with the
hardware findings behind it; the verdict's findings; then **every rank grouped under the place
where it waits** - the py-spy stacks of the bundle classified as the stack sampler classifies them
(:func:`gpu_triage.signals.stacks.dumps.classify`: phase, collective or save, the user's call site),
largest group first, each group's stack printed once; ranks without a readable stack in a group of
their own with the reason; and the items of ``index.json`` with their status.

Everything in a bundle is a claim of the job (frame names, file names, the job name, progress files)
or of the outside tools: every string is HTML-escaped, every file read is bounded, and a bad file
leaves its rank in the "no stack" group rather than failing the page. The page has no script, no
stylesheet link and no image from elsewhere: it opens on an air-gapped node and in a mail client.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_triage.signals.stacks.dumps import (
    MAX_DUMP_BYTES,
    Frame,
    StackError,
    StackInfo,
    ThreadStack,
    classify,
    group_key,
)

REPORT_FILE = "report.html"
MAX_JSON_BYTES = 4 << 20
MAX_SHOWN_FRAMES = 40

_THREAD = re.compile(
    r'^Thread (?P<tid>0x[0-9a-fA-F]+|\d+)(?: \((?P<state>[^)]*)\))?:?\s*(?:"(?P<name>.*)")?\s*$'
)
_FRAME = re.compile(r"^\s{2,}(?P<name>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
_PY_SPY_FILE = re.compile(r"^py-spy-rank(?P<rank>\d+|x)-pid(?P<pid>\d+)\.txt$")


#: py-spy's text dump shortens file names to the package path (``torch/distributed/...``), which
#: hides whether a frame is a library's. Short names under these top-level packages are read as
#: library frames (prefixed ``/site-packages/`` for the classifier, shown without the prefix).
LIBRARY_TOPS = frozenset(
    {
        "torch", "deepspeed", "transformers", "accelerate", "megatron", "lightning", "pytorch_lightning",
        "numpy", "safetensors", "datasets", "tokenizers", "apex", "triton", "threading.py", "runpy.py",
        "multiprocessing", "concurrent", "queue.py", "selectors.py", "socket.py", "asyncio", "contextlib.py",
        "functools.py", "subprocess.py", "typing_extensions.py", "typing.py", "dataclasses.py",
        "torchvision", "peft", "trl", "huggingface_hub", "tqdm", "wandb", "nvtx", "fairscale", "xformers",
        "flash_attn", "vllm", "ray",
    }
)  # fmt: skip
_LIB_PREFIX = "/site-packages/"


def _classifiable(file: str) -> str:
    if file.startswith(("/", "<")):
        return file
    return _LIB_PREFIX + file if file.split("/", 1)[0] in LIBRARY_TOPS else file


def _shown(file: str) -> str:
    return file.removeprefix(_LIB_PREFIX)


class ReportError(ValueError):
    """The directory is not an evidence bundle (the message names the path and what is missing)."""


# -- reading the bundle (bounded, every file a claim) ------------------------------------------------


def parse_text_dump(text: str) -> list[ThreadStack]:
    """``py-spy dump`` text output (what the bundle keeps) -> threads, innermost frame first.

    Lines that are neither a ``Thread`` header nor a frame (the command line, the process line,
    ``--locals`` values, stderr) are skipped; a dump with no thread raises :class:`StackError`."""
    threads: list[ThreadStack] = []
    name: str | None = None
    tid: int | None = None
    frames: list[Frame] = []

    def flush() -> None:
        if name is not None:
            threads.append(ThreadStack(name[:100], tid, tuple(frames[:256])))

    for raw in text.splitlines():
        if raw.startswith("--- stderr ---"):
            break
        header = _THREAD.match(raw)
        if header:
            flush()
            name, frames = header.group("name") or "", []
            digits = header.group("tid")
            tid = int(digits, 16) if digits.startswith("0x") else int(digits)
            continue
        frame = _FRAME.match(raw)
        if frame and name is not None:
            file = _classifiable(frame.group("file")[:500])
            frames.append(Frame(frame.group("name")[:200], file, int(frame.group("line"))))
    flush()
    if not threads:
        raise StackError("no thread in the py-spy output")
    return threads


def _read_text(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise StackError(f"{path.name} is larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path, MAX_JSON_BYTES))
    except (OSError, ValueError, StackError):
        return None


@dataclass(frozen=True, slots=True)
class RankDump:
    rank: int | None
    pid: int
    file: str
    info: StackInfo | None
    frames: tuple[Frame, ...]
    """The chosen thread's frames, innermost first (empty without a stack)."""
    error: str | None
    """Why there is no stack (py-spy failed, ptrace denied, an unreadable file)."""


@dataclass(frozen=True, slots=True)
class WaitGroup:
    key: str
    """``phase op @ call site`` (:func:`gpu_triage.signals.stacks.dumps.group_key`), or ``no stack``."""
    dumps: tuple[RankDump, ...]


def read_dump(path: Path, index_error: str | None = None) -> RankDump:
    """One ``py-spy-rank<R>-pid<P>.txt`` of the bundle, classified; never raises."""
    m = _PY_SPY_FILE.match(path.name)
    rank = None if m is None or m.group("rank") == "x" else int(m.group("rank"))
    pid = 0 if m is None else int(m.group("pid"))
    try:
        text = _read_text(path, MAX_DUMP_BYTES)
        threads = parse_text_dump(text)
        info = classify(threads)
    except (OSError, StackError) as e:
        reason = index_error or str(e)
        return RankDump(rank, pid, path.name, None, (), reason)
    chosen = next((t for t in threads if t.thread_name == info.thread and t.frames), threads[0])
    return RankDump(rank, pid, path.name, info, chosen.frames, None)


def group_by_wait(dumps: Iterable[RankDump]) -> list[WaitGroup]:
    """Ranks grouped by where they wait, largest group first (ties: the lowest rank first); the ranks
    without a stack last."""
    groups: dict[str, list[RankDump]] = {}
    missing: list[RankDump] = []
    for d in dumps:
        if d.info is None:
            missing.append(d)
        else:
            groups.setdefault(group_key(d.info), []).append(d)

    def order(d: RankDump) -> tuple[int, int]:
        return (d.rank if d.rank is not None else 1 << 30, d.pid)

    out = [WaitGroup(k, tuple(sorted(v, key=order))) for k, v in groups.items()]
    out.sort(key=lambda g: (-len(g.dumps), order(g.dumps[0])))
    if missing:
        out.append(WaitGroup("no stack", tuple(sorted(missing, key=order))))
    return out


def load_bundle(bundle: Path) -> tuple[dict[str, Any], list[WaitGroup], dict[str, Any]]:
    """(index, groups, status) of a bundle directory. Raises :class:`ReportError` when ``bundle`` is
    not a directory with an ``index.json``."""
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise ReportError(f"{bundle}: not a directory")
    index = _read_json(bundle / "index.json")
    if not isinstance(index, dict):
        raise ReportError(f"{bundle}: no readable index.json (is this an evidence bundle?)")
    errors: dict[str, str] = {}
    for item in index.get("items") or []:
        if isinstance(item, dict) and item.get("name") == "py_spy" and item.get("file") and item.get("error"):
            errors[str(item["file"])] = str(item["error"])
    dumps = [read_dump(p, errors.get(p.name)) for p in sorted(bundle.glob("py-spy-rank*-pid*.txt"))]
    status = _read_json(bundle / "status.json")
    return index, group_by_wait(dumps), status if isinstance(status, dict) else {}


# -- rendering (every string escaped) ----------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _time(t: Any) -> str:
    if not isinstance(t, int | float) or isinstance(t, bool):
        return "-"
    return (
        time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))
        + f" ({time.strftime('%H:%M:%S', time.gmtime(t))} UTC)"
    )


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2430;
max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d5dae1}
.sub{color:#5b6675}.verdict{display:inline-block;padding:2px 8px;border-radius:4px;color:#fff;font-weight:600}
.v-deadlock_confirmed{background:#b3261e}.v-deadlock_suspected{background:#d9730d}.v-other{background:#5b6675}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d5dae1;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f2f4f7}.group{border:1px solid #d5dae1;border-radius:6px;margin:12px 0;
padding:10px 14px}.group h3{margin:0 0 6px;font-size:15px}.count{font-weight:700;color:#b3261e}
.nostack h3 .count{color:#5b6675}pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12.5px;
margin:6px 0}
.ok{color:#1e7b34}.bad{color:#b3261e}.ranks span{display:inline-block;margin:0 6px 4px 0;padding:1px 6px;
background:#eef1f5;border-radius:3px;font-family:ui-monospace,monospace;font-size:12.5px}
"""


def _findings(status: Mapping[str, Any]) -> str:
    def member(doc: Any, key: str, kind: type) -> Any:
        value = doc.get(key) if isinstance(doc, dict) else None
        return value if isinstance(value, kind) else kind()

    job = member(dict(status), "job", dict)
    # the evidence's JSON form holds them (docs/detector.md); bundles written before issue 28 kept
    # them beside it, in job.findings
    findings = member(member(job, "evidence", dict), "findings", list) or member(job, "findings", list)
    if not findings:
        return "<p class='sub'>No findings recorded in status.json.</p>"
    rows = []
    for f in findings[:100]:
        if not isinstance(f, dict):
            continue
        who = f.get("ranks") if f.get("ranks") is not None else f.get("gpus")
        who_text = ", ".join(_e(x) for x in who[:64]) if isinstance(who, list) else ""
        rows.append(
            f"<tr><td>{_e(f.get('signal', ''))}</td><td>{_e(f.get('stance', ''))}</td>"
            f"<td>{_e(f.get('detail', ''))}</td><td>{who_text}</td><td>{_e(_time(f.get('since')))}</td></tr>"
        )
    return (
        "<table><tr><th>signal</th><th>stance</th><th>detail</th><th>ranks / GPUs</th><th>since</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _rank_label(d: RankDump) -> str:
    rank = "rank ?" if d.rank is None else f"rank {d.rank}"
    return f"{rank} (pid {d.pid})"


def _group_html(g: WaitGroup) -> str:
    n = len(g.dumps)
    ranks = "".join(f"<span>{_e(_rank_label(d))}</span>" for d in g.dumps)
    if g.key == "no stack":
        reasons = "".join(
            f"<tr><td>{_e(_rank_label(d))}</td><td>{_e(d.file)}</td><td>{_e(d.error or '')}</td></tr>"
            for d in g.dumps
        )
        return (
            f"<div class='group nostack' data-key='no stack'><h3><span class='count'>{n} rank"
            f"{'s' if n != 1 else ''}</span> without a stack</h3><div class='ranks'>{ranks}</div>"
            f"<table><tr><th>rank</th><th>file</th><th>why</th></tr>{reasons}</table></div>"
        )
    first = g.dumps[0]
    assert first.info is not None
    info = first.info
    shown = [f"{f.name}  ({_shown(f.filename)}:{f.line})" for f in first.frames[:MAX_SHOWN_FRAMES]]
    if len(first.frames) > MAX_SHOWN_FRAMES:
        shown.append(f"... {len(first.frames) - MAX_SHOWN_FRAMES} more")
    frames = "\n".join(shown)
    same = len({d.info.fingerprint for d in g.dumps if d.info is not None}) == 1
    if n == 1:
        note = "one rank"
    elif same:
        note = "the same stack on every rank of the group"
    else:
        note = "same place, stacks differ below it (shown: the first rank's)"
    return (
        f"<div class='group' data-key='{_e(g.key)}'><h3><span class='count'>{n} rank{'s' if n != 1 else ''}"
        f"</span> waiting in <code>{_e(info.phase)}{(' ' + _e(info.op)) if info.op else ''}</code> at "
        f"<code>{_e(info.call_site or '?')}</code></h3><div class='ranks'>{ranks}</div>"
        f"<div class='sub'>thread {_e(info.thread)}; {note}; innermost frame first</div>"
        f"<pre>{_e(frames)}</pre></div>"
    )


def _items(index: Mapping[str, Any]) -> str:
    rows = []
    for item in (index.get("items") or [])[:500]:
        if not isinstance(item, dict):
            continue
        ok = item.get("status") == "ok"
        who = f" rank {item['rank']}" if item.get("rank") is not None else ""
        rows.append(
            f"<tr><td>{_e(item.get('name', ''))}{_e(who)}</td>"
            f"<td class='{'ok' if ok else 'bad'}'>{_e(item.get('status', ''))}</td>"
            f"<td>{_e(item.get('file') or '')}</td><td>{_e(item.get('error') or '')}</td>"
            f"<td>{_e(item.get('duration_s', ''))}</td></tr>"
        )
    return (
        "<table><tr><th>item</th><th>status</th><th>file</th><th>error</th><th>seconds</th></tr>"
        + "".join(rows)
        + "</table>"
    )


BLAME_WORDS = {
    "job": "the job (its code or data): the node's GPUs show no fault under this verdict",
    "node": "this node's hardware: a fault on one of the job's GPUs (or a GPU lost) - drain the node, "
    "restart the job elsewhere; never a deterministic hang",
    "network": "the fabric (NVLink, NVSwitch): restart the job elsewhere, check the links",
    "unknown": "nobody known: a hardware finding nobody catalogued sits under the verdict",
}


def _blame(status: Mapping[str, Any]) -> str:
    """Whom the verdict blames and the hardware findings behind it (docs/detector.md, "Blame")."""
    raw_job = status.get("job")
    job: dict[str, Any] = raw_job if isinstance(raw_job, dict) else {}
    raw_evidence = job.get("evidence")
    evidence: dict[str, Any] = raw_evidence if isinstance(raw_evidence, dict) else {}
    blame = job.get("blame") or evidence.get("blame")
    if not isinstance(blame, str):
        return "<p class='sub'>No blame recorded in status.json (an older daemon).</p>"
    words = BLAME_WORDS.get(blame, "")
    out = f"<p><b>{_e(blame)}</b>: {_e(words)}</p>"
    hardware = evidence.get("hardware")
    rows = []
    for h in hardware[:64] if isinstance(hardware, list) else ():
        if not isinstance(h, dict):
            continue
        gpu = h.get("gpu")
        xid = h.get("xid")
        cells: list[Any] = ["node" if gpu is None else gpu, h.get("kind", ""), "" if xid is None else xid]
        cells += [h.get("level", ""), h.get("blame", ""), h.get("action", ""), h.get("detail", "")]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    if rows:
        out += (
            "<table><tr><th>GPU</th><th>kind</th><th>Xid</th><th>level</th><th>blame</th><th>action</th>"
            "<th>detail</th></tr>" + "".join(rows) + "</table>"
        )
    return out


def render_report(index: Mapping[str, Any], groups: Sequence[WaitGroup], status: Mapping[str, Any]) -> str:
    """The page (pure: the bundle's parsed contents in, HTML out)."""
    job = index.get("job", "?")
    verdict = str(index.get("verdict", "?"))
    vclass = verdict if verdict in ("deadlock_confirmed", "deadlock_suspected") else "other"
    ranked = sum(len(g.dumps) for g in groups if g.key != "no stack")
    places = sum(1 for g in groups if g.key != "no stack")
    if ranked == 0:
        headline = "No rank's stack could be read (see the ranks without a stack below)."
    elif places == 1:
        headline = f"All {ranked} ranks with a stack wait in the same place."
    else:
        sizes = sorted(len(g.dumps) for g in groups if g.key != "no stack")
        odd = " the smallest group is the odd one." if sizes[0] < sizes[-1] else ""
        headline = f"{ranked} ranks with a stack wait in {places} different places.{odd}"
    body = "".join(_group_html(g) for g in groups) or "<p class='sub'>No py-spy dump in this bundle.</p>"
    complete = index.get("complete")
    took = f"; took {_e(index.get('duration_s'))} s" if index.get("duration_s") is not None else ""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Evidence: {_e(job)} ({_e(verdict)})</title><style>{_CSS}</style></head><body>"
        f"<h1>Evidence bundle: {_e(job)} <span class='verdict v-{_e(vclass)}'>{_e(verdict)}</span></h1>"
        f"<div class='sub'>node {_e(index.get('node', '?'))}; captured {_e(_time(index.get('created')))}; "
        f"{'complete' if complete else 'INCOMPLETE (the capture did not finish)'}"
        f"{took}</div>"
        f"<h2>Whom it blames</h2>{_blame(status)}"
        f"<h2>Where the ranks wait</h2><p>{_e(headline)}</p>{body}"
        f"<h2>Why the watchdog said {_e(verdict)}</h2>{_findings(status)}"
        f"<h2>What the bundle holds</h2>{_items(index)}"
        "<p class='sub'>Written by gpu-watchdog (docs/evidence.md, \"The HTML report\"). "
        "Strings from the job are shown escaped, as text.</p></body></html>\n"
    )


def write_report(bundle: Path) -> Path:
    """Write ``report.html`` into ``bundle`` (atomically) and return its path; :class:`ReportError`
    when the directory is not a bundle."""
    bundle = Path(bundle)
    index, groups, status = load_bundle(bundle)
    text = render_report(index, groups, status)
    out = bundle / REPORT_FILE
    tmp = bundle / f".{REPORT_FILE}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out
