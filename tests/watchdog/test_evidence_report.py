"""The evidence bundle's HTML report: every rank under the place it waits, hostile strings escaped,
nothing loaded from elsewhere, written by the capture and by ``gpu-watchdog evidence-report``."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpu_triage.actions.evidence_bundle import CaptureRequest, EvidenceCapture, RankTarget, bundle_path
from gpu_triage.actions.evidence_report import REPORT_FILE, load_bundle, parse_text_dump, write_report
from gpu_triage.actions.kill_targets import CommandResult
from tests.watchdog.snapshots import T0

DUMPS = Path(__file__).parent / "stack_dumps"
SITE = "/usr/lib/python3.11/site-packages/"


def as_text(doc: list[dict], pid: int, *, short: bool = True) -> str:
    """A py-spy ``dump --json`` document written as ``py-spy dump`` prints it (short file names)."""
    lines = [f"Process {pid}: python train.py", "Python v3.11.7 (/usr/bin/python3.11)", ""]
    for thread in doc:
        lines.append(f'Thread {thread["os_thread_id"]} (idle): "{thread["thread_name"]}"')
        for frame in thread["frames"]:
            name = frame["short_filename"] if short else frame["filename"]
            lines.append(f"    {frame['name']} ({name}:{frame['line']})")
    return "\n".join(lines) + "\n"


def frames_text(thread: str, frames: list[tuple[str, str, int]], tid: int = 1) -> str:
    return f'Thread {tid} (idle): "{thread}"\n' + "".join(f"    {n} ({f}:{ln})\n" for n, f, ln in frames)


BARRIER = json.loads((DUMPS / "deepspeed_epoch_end_rank0_barrier.json").read_text())
REDUCE_SCATTER = json.loads((DUMPS / "deepspeed_epoch_end_rank1_reduce_scatter.json").read_text())


def make_bundle(
    root: Path, *, job: str = "qwen3-32b-ft", dumps: dict[tuple[int, int], str], failed=()
) -> Path:
    """A bundle as the capture writes it: index.json, status.json, one py-spy file per rank."""
    root.mkdir(parents=True)
    items = []
    for (rank, pid), text in dumps.items():
        name = f"py-spy-rank{rank}-pid{pid}.txt"
        body = f"$ py-spy dump --pid {pid}\n# exit code: 0\n\n{text}"
        item = {"name": "py_spy", "status": "ok", "file": name, "rank": rank, "pid": pid, "duration_s": 0.1}
        if (rank, pid) in failed:
            body = f"$ py-spy dump --pid {pid}\n# exit code: 1\n\n\n--- stderr ---\nError: Permission denied"
            item = {**item, "status": "error", "error": "ptrace not permitted (Operation not permitted)"}
        (root / name).write_text(body)
        items.append(item)
    index = {
        "job": job,
        "node": "node-a",
        "verdict": "deadlock_confirmed",
        "created": T0,
        "complete": True,
        "duration_s": 0.4,
        "ranks": [{"rank": r, "pid": p, "gpu": r} for r, p in dumps],
        "items": items,
    }
    (root / "index.json").write_text(json.dumps(index))
    status = {
        "job": {
            "job": job,
            "verdict": "deadlock_confirmed",
            "evidence": {
                "findings": [
                    {
                        "signal": "steps_frozen",
                        "stance": "hang",
                        "detail": "no train rank advanced",
                        "ranks": [0, 1],
                    }
                ]
            },
        }
    }
    (root / "status.json").write_text(json.dumps(status))
    return root


class Groups(HTMLParser):
    """The report's groups as a reader sees them: data-key -> the rank labels listed in it; and every
    tag the page contains."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, list[str]] = {}
        self.tags: set[str] = set()
        self._key: str | None = None
        self._depth = 0
        self._in_span = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        a = dict(attrs)
        if tag == "div" and "group" in (a.get("class") or "").split():
            self._key, self._depth = a.get("data-key") or "", 0
            self.groups[self._key] = []
        if tag == "div" and self._key is not None:
            self._depth += 1
        self._in_span = tag == "span" and self._key is not None

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self._key is not None:
            self._depth -= 1
            if self._depth == 0:
                self._key = None
        if tag == "span":
            self._in_span = False

    def handle_data(self, data: str) -> None:
        if self._in_span and self._key is not None and data.startswith("rank"):
            self.groups[self._key].append(data)


def read_groups(html_text: str) -> Groups:
    parser = Groups()
    parser.feed(html_text)
    return parser


def test_text_dump_parses_threads_and_frames() -> None:
    text = as_text(BARRIER, 30113)
    threads = parse_text_dump(text)
    assert [t.thread_name for t in threads] == [t["thread_name"] for t in BARRIER]
    main = threads[0]
    assert main.frames[0].name == "barrier" and main.frames[0].line == 5356
    assert main.frames[0].filename.endswith("torch/distributed/distributed_c10d.py")


def test_every_rank_is_grouped_under_where_it_waits(tmp_path: Path) -> None:
    """Three ranks in the epoch-end barrier, one in the reduce-scatter of the next step (the odd one),
    one whose py-spy failed: each rank appears once, in its own group, the failure with its reason."""
    dumps = {
        (0, 100): as_text(BARRIER, 100),
        (1, 101): as_text(REDUCE_SCATTER, 101),
        (2, 102): as_text(BARRIER, 102),
        (3, 103): as_text(BARRIER, 103, short=False),  # full file names (py-spy --full-filenames)
        (4, 104): "",
    }
    bundle = make_bundle(tmp_path / "b", dumps=dumps, failed={(4, 104)})
    out = write_report(bundle)
    assert out == bundle / REPORT_FILE
    page = read_groups(out.read_text())
    _, groups, _ = load_bundle(bundle)
    barrier_key = next(g.key for g in groups if "barrier" in g.key)
    rs_key = next(g.key for g in groups if "reduce_scatter" in g.key)
    assert barrier_key.startswith("collective barrier @ ") and "plain_deepspeed.py" in barrier_key
    assert rs_key.startswith("collective reduce_scatter")
    assert page.groups == {
        barrier_key: ["rank 0 (pid 100)", "rank 2 (pid 102)", "rank 3 (pid 103)"],
        rs_key: ["rank 1 (pid 101)"],
        "no stack": ["rank 4 (pid 104)"],
    }
    text = out.read_text()
    assert "ptrace not permitted" in text
    assert "4 ranks with a stack wait in 2 different places" in text
    assert "steps_frozen" in text  # the verdict's findings


def test_hostile_strings_are_escaped(tmp_path: Path) -> None:
    """A job name, a frame name and a file name are the job's claims: shown as text, never markup."""
    job = '<script>alert("job")</script>'
    evil_frame = "<img src=x onerror=alert(1)>"
    evil_file = 'train"><b>bold</b>.py'
    dump = frames_text(
        "MainThread",
        [
            ("barrier", "torch/distributed/distributed_c10d.py", 10),
            (evil_frame, evil_file, 7),
        ],
    )
    bundle = make_bundle(tmp_path / "b", job=job, dumps={(0, 100): dump, (1, 101): dump})
    text = write_report(bundle).read_text()
    for raw in (job, evil_frame, "<b>bold</b>", '"><b>'):
        assert raw not in text
    assert "&lt;script&gt;alert(&quot;job&quot;)&lt;/script&gt;" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    page = read_groups(text)
    assert page.tags.isdisjoint({"script", "img", "b", "iframe", "link"})
    (key,) = [k for k in page.groups if k != "no stack"]
    assert evil_frame in key  # the parser unescapes the attribute: the same string, inert
    assert page.groups[key] == ["rank 0 (pid 100)", "rank 1 (pid 101)"]


def test_the_page_loads_nothing_from_elsewhere(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", dumps={(0, 100): as_text(BARRIER, 100)})
    text = write_report(bundle).read_text()
    assert text.startswith("<!DOCTYPE html>")
    for needle in ("<script", "<link", "src=", "http://", "https://", "@import", "url("):
        assert needle not in text


def test_the_capture_writes_the_report(tmp_path: Path) -> None:
    """EvidenceCapture ends with report.html beside index.json (py-spy's output from the runner)."""

    class Runner:
        def run(self, argv, *, timeout_s):  # the outside commands' boundary
            pid = int(argv[-1])
            text = as_text(BARRIER if pid == 100 else REDUCE_SCATTER, pid)
            return CommandResult(tuple(argv), 0, text, "", 0.1)

    path = bundle_path(tmp_path / "state", "job-a", T0)
    request = CaptureRequest(
        job="job-a",
        node="node-a",
        verdict="deadlock_suspected",
        path=path,
        ranks=(RankTarget(0, 100, 0), RankTarget(1, 101, 1)),
        status={"job": {"job": "job-a", "verdict": "deadlock_suspected"}},
        progress_dir=tmp_path / "progress",
        timeout_s=5.0,
        py_spy="/usr/bin/py-spy",
        nvidia_smi=None,
        ras_host="127.0.0.1",
        ras_port=1,
    )
    EvidenceCapture(Runner()).capture(request)
    page = read_groups((path / REPORT_FILE).read_text())
    assert sorted(r for ranks in page.groups.values() for r in ranks) == [
        "rank 0 (pid 100)",
        "rank 1 (pid 101)",
    ]
    assert len(page.groups) == 2


def test_cli_writes_the_report_and_refuses_a_non_bundle(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", dumps={(0, 100): as_text(BARRIER, 100)})
    ok = subprocess.run(
        [sys.executable, "-m", "gpu_triage", "evidence-report", str(bundle)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, str(bundle / REPORT_FILE))
    bad = subprocess.run(
        [sys.executable, "-m", "gpu_triage", "evidence-report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "index.json" in bad.stderr and str(tmp_path) in bad.stderr


@pytest.mark.parametrize("junk", [b"\xff\xfe" * 100, b"Thread x\n    (:)\n", b"", b"{" * 5000])
def test_a_bad_dump_leaves_its_rank_without_a_stack(tmp_path: Path, junk: bytes) -> None:
    bundle = make_bundle(tmp_path / "b", dumps={(0, 100): as_text(BARRIER, 100), (1, 101): ""})
    (bundle / "py-spy-rank1-pid101.txt").write_bytes(junk)
    page = read_groups(write_report(bundle).read_text())
    assert page.groups["no stack"] == ["rank 1 (pid 101)"]
