"""``gpu-watchdog``: the daemon, offline triage, and the tools around them.

Exit codes (contract): 0 ok; 1 a deadlock verdict found (triage, status, cluster); 2 bad input, bad
config or unreachable daemon, with a message naming the file, line and field. With several files the
highest code wins.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

from gpu_triage import __version__
from gpu_triage.model.limits import MAX_GPUS, finite_or_none

EXIT_OK, EXIT_DEADLOCK, EXIT_BAD_INPUT = 0, 1, 2

_EPILOG_TRIAGE = """\
examples:
  gpu-watchdog triage run.csv                      # model and limit from the file's name/power.limit columns
  gpu-watchdog triage --model H100 --gpus 8 run.csv --plot run.png
  gpu-watchdog triage --power-limit 250 --gpus 2 titanx.csv --json

Recordings are nvidia-smi CSV logs, e.g. from
  nvidia-smi --query-gpu=timestamp,index,name,power.draw,power.limit,utilization.gpu,memory.used \\
             --format=csv -lms 100 > run.csv
Without an index column, rows are taken as complete snapshots in board order (pass --gpus if the count
cannot be inferred; a --gpus that does not divide the rows is an error). A recording made with
--format=csv,noheader needs its field list:
  gpu-watchdog triage --columns timestamp,index,power.draw,utilization.gpu run.csv

Power alone cannot tell a hang from a save: waiting GPUs spin the same way. Triage cuts each GPU
group's spin into waits at every compute burst (progress, however short), learns the recording's own
save cadence from the waits that ended in progress, and reports a *suspected* deadlock, with its
evidence, only for a wait that never ended in progress, lasted --deadlock-after and, once a cadence is
known, more than twice the longest wait the job came back from (docs/triage.md).
Exit status: 0 clean, 1 a suspected deadlock, 2 bad input.
"""


def _positive(parse, what: str, upper: float | None = None):
    """An argparse type: ``parse(text)`` must succeed and give 0 < value (<= ``upper``)."""

    def check(text: str):
        try:
            v = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(v) or v <= 0 or (upper is not None and v > upper):
            bound = f"in (0, {upper:g}]" if upper is not None else "above 0"
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text}")
        return v

    return check


def _field_list(text: str) -> tuple[str, ...]:
    """``--columns timestamp,index,power.draw`` -> the nvidia-smi field names, in order."""
    fields = tuple(f.strip() for f in text.split(","))
    if not fields or any(not f for f in fields):
        raise argparse.ArgumentTypeError(f"expected comma-separated nvidia-smi field names, got {text!r}")
    return fields


_positive_float = _positive(float, "a number")
_positive_int = _positive(int, "a whole number")
_gpu_count = _positive(int, "a GPU count", MAX_GPUS)


def build_parser() -> argparse.ArgumentParser:
    from gpu_triage.triage import DEFAULT_DEADLOCK_AFTER_S  # numpy-free: the base install parses too

    parser = argparse.ArgumentParser(
        prog="gpu-watchdog",
        description="Per-node GPU training watchdog: classifies each GPU by board power (compute, "
        "communication, data starvation, checkpoint-or-deadlock, idle), detects deadlocks, and triages "
        "recorded nvidia-smi logs offline.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-watchdog {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser(
        "triage",
        help="classify recorded nvidia-smi CSV logs and look for suspected deadlocks",
        description="Classify every GPU of recorded nvidia-smi CSV logs, find the waits and their "
        "cadence, and apply the power-only rule for suspected deadlocks.",
        epilog=_EPILOG_TRIAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("files", nargs="+", metavar="FILE", help="nvidia-smi CSV recording(s)")
    t.add_argument(
        "--model",
        help="GPU model table (B300, B200, H200, H100, A100, generic) when the file does not name the GPU",
    )
    t.add_argument("--table", metavar="TOML", help="a power table file (e.g. written by calibrate)")
    t.add_argument(
        "--gpus",
        type=_gpu_count,
        help="GPU count, needed only without an index column when it cannot be inferred",
    )
    t.add_argument(
        "--power-limit",
        type=_positive_float,
        metavar="W",
        help="enforced power limit in watts "
        "(overrides the file's power.limit column and the table's default)",
    )
    t.add_argument(
        "--deadlock-after",
        type=_positive(float, "seconds"),
        default=DEFAULT_DEADLOCK_AFTER_S,
        metavar="SECONDS",
        help="the shortest wait (a GPU group in checkpoint_or_deadlock with no compute burst, never "
        "ending in progress) reported as a suspected deadlock; once the recording shows its save cadence "
        "a wait must also last over twice the longest wait the job came back from. Default "
        f"{DEFAULT_DEADLOCK_AFTER_S:g} s; any positive duration (raise it where a save written from another "
        "node can take longer and the recording shows no earlier save; see docs/triage.md)",
    )
    t.add_argument(
        "--columns",
        type=_field_list,
        metavar="FIELDS",
        help="the --query-gpu field list of a recording without a header line (--format=csv,noheader), "
        "comma-separated as given to nvidia-smi, e.g. timestamp,index,power.draw,utilization.gpu",
    )
    t.add_argument("--json", action="store_true", help="one JSON object per file (an array for several)")
    t.add_argument(
        "--plot",
        metavar="PNG",
        help="write a plot of power per GPU coloured by state (several files: FILE's name is appended)",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar on large files")
    t.set_defaults(func=cmd_triage)

    tb = sub.add_parser(
        "tables",
        help="print the built-in power tables",
        description="Print the power bands of each built-in table, as fractions of the "
        "enforced power limit and in watts, with the source of every number.",
    )
    tb.add_argument("--model", help="only this model")
    tb.add_argument("--json", action="store_true")
    tb.add_argument(
        "--plot", metavar="PNG", help="draw the bands of each table in the power x utilisation plane"
    )
    tb.set_defaults(func=cmd_tables)

    c = sub.add_parser(
        "calibrate",
        help="fit a power table from recordings labelled by phase",
        description="Fit the bands of a power table from recordings whose phases are "
        "labelled (CSV with start_s,end_s,label; label one of the GPU states, or "
        "checkpoint_wait). Writes a TOML table usable with --table / [classifier] table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  gpu-watchdog calibrate --model H100 --gpus 8 "
        "--labels run.labels.csv run.csv --out h100-ours.toml",
    )
    c.add_argument("files", nargs="+", metavar="FILE", help="nvidia-smi CSV recording(s)")
    c.add_argument(
        "--labels",
        action="append",
        required=True,
        metavar="CSV",
        help="phase labels, one file per recording in the same order",
    )
    c.add_argument(
        "--model", help="base table the fit starts from (default: matched from the file, else generic)"
    )
    c.add_argument("--gpus", type=_gpu_count)
    c.add_argument("--power-limit", type=_positive_float, metavar="W")
    c.add_argument(
        "--unlabelled",
        default="compute",
        metavar="STATE",
        help="state of samples outside every label interval, or 'ignore' (default compute)",
    )
    c.add_argument("--name", help="model name written in the table (default: the base model)")
    c.add_argument("--out", required=True, metavar="TOML")
    c.set_defaults(func=cmd_calibrate)

    r = sub.add_parser(
        "run",
        help="run the daemon in the foreground (what the systemd unit starts)",
        description="Sample GPU telemetry, classify every GPU, read the trainer's progress "
        "files and the rank processes, detect deadlocks, act, and serve REST + /metrics, "
        "until SIGTERM or Ctrl-C. SIGHUP reloads the configuration.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="sources:\n  auto          nvml where the NVIDIA library loads, else none (never sim)\n"
        "  nvml          NVIDIA Management Library (every call under a hard deadline)\n"
        "  none          no GPU telemetry: progress files and processes only\n"
        "  sim[:NAME]    a scripted scenario (default reference-b300): demos and tests\n"
        "  replay:FILE   an nvidia-smi CSV recording replayed in real time\n\n"
        "examples:\n  gpu-watchdog run --config /etc/gpu-watchdog/config.toml --source nvml\n"
        "  gpu-watchdog run --source sim --state-dir ./state --summary\n"
        "  curl -s 127.0.0.1:9410/status | jq .jobs",
    )
    r.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config (default /etc/gpu-watchdog/config.toml if it "
        "exists); every key is documented in deploy/config.example.toml",
    )
    r.add_argument("--source", metavar="SPEC", help="nvml | sim[:NAME] | replay:FILE | none | auto")
    r.add_argument("--listen", metavar="HOST:PORT", help="REST + /metrics address (default 127.0.0.1:9410)")
    r.add_argument(
        "--state-dir", metavar="DIR", help="event store and evidence (default /var/lib/gpu-watchdog)"
    )
    r.add_argument(
        "--progress-dir", metavar="DIR", help="trainer progress files (default /run/gpu-watchdog/progress)"
    )
    r.add_argument("--period", type=_positive_float, metavar="SECONDS", help="telemetry period (0.1 .. 60)")
    r.add_argument(
        "--mode",
        choices=["observe", "alert", "kill"],
        help="start in this mode (kill needs it here or in the config: the daemon never arms itself)",
    )
    r.add_argument(
        "--kernel-log-file",
        metavar="FILE",
        help="a kernel log file for the health signal, read besides /dev/kmsg: the kernel log of a "
        "replayed recording, or Xid lines fed to --source sim ([health] kernel_log_file)",
    )
    r.add_argument("--sim-start", type=float, metavar="EPOCH", help=argparse.SUPPRESS)
    r.add_argument("--summary", action="store_true", help="print a one-line state summary every second")
    r.set_defaults(func=cmd_run)

    st = sub.add_parser(
        "status",
        help="one daemon's GPUs and jobs as tables",
        description="Fetch GET /status from a daemon and show its GPUs (state, power, since) and jobs "
        "(verdict, onset, lagging ranks, evidence), times in local time with their age. "
        "Exit status: 0 ok, 1 a deadlock verdict, 2 unreachable.",
    )
    st.add_argument("--url", default="http://127.0.0.1:9410", help="daemon URL (default %(default)s)")
    st.add_argument("--json", action="store_true", help="print the daemon's /status document as it came")
    st.add_argument("--timeout", type=_positive_float, default=2.0, metavar="S", help="seconds (default 2)")
    st.add_argument(
        "--watch",
        type=_positive_float,
        nargs="?",
        const=2.0,
        metavar="S",
        help="redraw in place every S seconds (default 2) until Ctrl-C",
    )
    st.set_defaults(func=cmd_status)

    cl = sub.add_parser(
        "cluster",
        help="several daemons side by side: which node entered the spin band first, which rank lags",
        description="Fetch GET /status from several daemons in parallel and compare them: per node its "
        "source, mode, GPU states and verdicts; which node entered the spin band (checkpoint_or_deadlock) "
        "first; per job, the rank whose step lags. Exit status: 0 ok, 1 a deadlock verdict on any node, "
        "2 any daemon unreachable. With --prometheus, the same from every node's facts that Prometheus "
        "already holds (one query, any number of nodes). See docs/cluster.md.",
        epilog="examples:\n  gpu-watchdog cluster node-a:9410 node-b:9410 --json | jq .first_in_spin_band\n"
        "  gpu-watchdog cluster --prometheus http://prometheus:9090 --job qwen3-32b-ft",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cl.add_argument("urls", nargs="*", metavar="URL", help="host, host:port or http://host:port")
    cl.add_argument(
        "--prometheus",
        metavar="URL",
        help="read every node's facts from this Prometheus (or Thanos/Mimir) instead of polling daemons",
    )
    cl.add_argument("--job", metavar="NAME", help="with --prometheus: only this training job")
    cl.add_argument("--json", action="store_true", help="one JSON document")
    cl.add_argument("--timeout", type=_positive_float, default=2.0, metavar="S", help="seconds (default 2)")
    cl.set_defaults(func=cmd_cluster)

    d = sub.add_parser(
        "demo-run", help="what `make run` starts: run, on real GPUs or else the built-in simulation"
    )
    d.add_argument("--state-dir", default="state")
    d.add_argument("--port", type=int, default=9410)
    d.add_argument("--sim-skip", type=float, default=0.0)
    d.set_defaults(func=cmd_demo_run)

    from gpu_triage.cli.ops import add_parsers as add_ops_parsers

    add_ops_parsers(sub)  # check-config, render-rules

    from gpu_triage.cli import slurm_health  # stdlib only: cheap for every invocation

    slurm_health.add_subparser(sub)
    return parser


def cmd_triage(args: argparse.Namespace) -> int:
    from gpu_triage.recordings.nvsmi_csv import RecordingError
    from gpu_triage.triage.engine import TriageInputError, TriageOptions
    from gpu_triage.triage.report import render

    opts = TriageOptions(
        model=args.model,
        gpus=args.gpus,
        power_limit_w=args.power_limit,
        deadlock_after_s=args.deadlock_after,
        table_path=args.table,
        keep_plot_points=bool(args.plot),
        columns=args.columns,
    )
    code = EXIT_OK
    outputs: list[dict] = []
    for path in args.files:
        try:
            result = _triage_with_progress(path, opts, show=not args.no_progress and not args.json)
        except (RecordingError, TriageInputError, OSError) as e:
            msg = str(e) if not isinstance(e, OSError) else f"{path}: {e.strerror or e}"
            if not msg.startswith(str(path)):
                msg = f"{path}: {msg}"  # every error names the file
            print(f"gpu-watchdog triage: error: {msg}", file=sys.stderr)
            outputs.append({"file": path, "error": msg})
            code = max(code, EXIT_BAD_INPUT)
            continue
        if result.deadlock:
            code = max(code, EXIT_DEADLOCK)
        if args.plot:
            from pathlib import Path

            from gpu_triage.triage.plot import plot

            out = Path(args.plot)
            if len(args.files) > 1:
                out = out.with_name(f"{out.stem}-{Path(path).stem}{out.suffix or '.png'}")
            plot(result, out)
            if not args.json:
                print(f"  plot: {out}")
        if args.json:
            outputs.append(result.to_json())
        else:
            print(render(result))
    if args.json:
        doc = outputs[0] if len(args.files) == 1 else outputs
        doc = finite_or_none(doc)  # NaN/Infinity are not JSON: null
        json.dump(doc, sys.stdout, indent=None if len(json.dumps(doc)) > 2000 else 1, allow_nan=False)
        sys.stdout.write("\n")
    return code


def _triage_with_progress(path: str, opts, show: bool):
    import os

    from gpu_triage.triage.engine import triage_file

    size = os.path.getsize(path)
    if not show or size < (64 << 20) or not sys.stderr.isatty():
        return triage_file(path, opts)
    from tqdm import tqdm

    with tqdm(total=size, unit="B", unit_scale=True, desc=os.path.basename(path), file=sys.stderr) as bar:

        def advance(offset: int) -> None:
            bar.update(offset - bar.n)

        return triage_file(path, opts, progress=advance)


def cmd_tables(args: argparse.Namespace) -> int:
    from gpu_triage.classify.power_table import TableError
    from gpu_triage.classify.table_files import all_tables, builtin_table
    from gpu_triage.classify.table_render import render_tables

    try:
        tables = [builtin_table(args.model)] if args.model else all_tables()
    except TableError as e:
        print(f"gpu-watchdog tables: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        json.dump([t.to_dict() for t in tables], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render_tables(tables))
    if args.plot:
        from gpu_triage.classify.table_figure import plot_tables

        print(f"plot: {plot_tables(tables, args.plot)}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    from gpu_triage.triage.calibrate import CalibrationError, calibrate_files

    try:
        text, summary = calibrate_files(
            args.files,
            args.labels,
            model=args.model,
            gpus=args.gpus,
            power_limit_w=args.power_limit,
            unlabelled=args.unlabelled,
            name=args.name,
        )
    except CalibrationError as e:
        print(f"gpu-watchdog calibrate: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from pathlib import Path

    Path(args.out).write_text(text)
    print(summary)
    print(f"wrote {args.out}")
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from gpu_triage.cli.run import run_daemon

    return run_daemon(args)


def cmd_status(args: argparse.Namespace) -> int:
    from gpu_triage.cli.status import run

    return run(args.url, as_json=args.json, timeout_s=args.timeout, watch_s=args.watch)


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.prometheus:
        from gpu_triage.cli.cluster_prometheus import run as from_prometheus

        if args.urls:
            print("gpu-watchdog cluster: give daemon URLs or --prometheus, not both", file=sys.stderr)
            return 2
        return from_prometheus(args.prometheus, job=args.job, as_json=args.json, timeout_s=args.timeout)
    if not args.urls:
        print("gpu-watchdog cluster: give daemon URLs, or --prometheus URL", file=sys.stderr)
        return 2
    from gpu_triage.cli.cluster import run

    return run(args.urls, as_json=args.json, timeout_s=args.timeout)


def cmd_demo_run(args: argparse.Namespace) -> int:
    from gpu_triage.demo.run import main as demo_main

    return demo_main(state_dir=args.state_dir, port=args.port, sim_skip_s=args.sim_skip)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except ModuleNotFoundError as e:  # the base (client-only) wheel: say which extra, exit 2 not 1
        from gpu_triage.cli.extras import missing_extra_hint

        hint = missing_extra_hint("gpu-watchdog", args.command, e, "daemon")
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
