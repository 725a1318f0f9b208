"""Recordings with a known truth for offline triage: generated wait shapes and the real traces.

The generated ones are written by the project's nvidia-smi CSV writer from simulated scenarios
(``Scenario.from_phases``), in the shapes that power alone makes hard:

* **checkpoint every step**: the waiting GPUs spin (100 % utilisation at ~0.21 of the limit) for
  ~12-20 s per save while GPU 0 writes (low utilisation), with compute bursts of half a second between
  saves - the shape of a real 8 x H100 job that saves every step;
* **long remote saves**: every GPU of the node waits ~400 s per save (the writer is on another node),
  training between;
* the same with a **real hang spliced after** them (every GPU spinning, no burst, for longer than the
  recording's own waits), or a save that never ends (the writer beside, the others spinning);
* two jobs on one node, one hung while the other checkpoints every step.

Truth: the hangs (GPUs and onset); a recording without any is healthy. ``real_cases`` adds every real
recording in ../shared/traces (all healthy; the H100 ones with their labelled checkpoint waits).
The benchmark ``python -m benchmarks triage_truth`` prints triage's precision and recall over them.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpu_triage.telemetry.recording_writer import write_nvsmi_csv
from gpu_triage.telemetry.sim import GpuBehaviour, Phase, Scenario

TRAIN = GpuBehaviour(0.78, 0.92, power_jitter_fraction=0.01, util_jitter=0.02, memory_used_fraction=0.4)
SPIN = GpuBehaviour(0.215, 1.0, power_jitter_fraction=0.004, memory_used_fraction=0.4)
WRITER = GpuBehaviour(0.20, 0.05, power_jitter_fraction=0.004, memory_used_fraction=0.4)
# A step of well under a second, as a one-second-averaged H100 sensor shows it: above the spin band,
# below the compute floor (the real every-step recording reads 0.33-0.37 of the limit).
BURST = GpuBehaviour(0.35, 1.0, power_jitter_fraction=0.01, memory_used_fraction=0.4)
WRITER_BURST = GpuBehaviour(0.33, 0.3, power_jitter_fraction=0.01, memory_used_fraction=0.4)
IDLE = GpuBehaviour(0.10, 0.0, power_jitter_fraction=0.002, memory_used_fraction=0.0)
LOADING = GpuBehaviour(0.17, 0.02, power_jitter_fraction=0.002, memory_used_fraction=0.4)
EDGE_SPIN = GpuBehaviour(0.29, 1.0, power_jitter_fraction=0.004, memory_used_fraction=0.4)


@dataclass(frozen=True, slots=True)
class Hang:
    gpus: tuple[int, ...]
    onset_s: float


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    build: Callable[[Path], Path]
    """Writes (or finds) the recording under the given folder and returns its path."""
    hangs: tuple[Hang, ...] = ()
    options: dict[str, object] = field(default_factory=dict)
    """TriageOptions keyword arguments."""
    checkpoint_waits: tuple[tuple[float, float], ...] = ()
    """Labelled checkpoint waits (start_s, end_s), where known."""
    note: str = ""
    limit: str = ""
    """Set when triage is known to miss this hang (by design): why."""


def _waits(rng: np.random.Generator, count: int, low_s: float, high_s: float) -> list[float]:
    return [float(x) for x in rng.uniform(low_s, high_s, count)]


def every_step_phases(steps: int, seed: int = 0, writer: int = 0, burst_s: float = 0.5) -> list[Phase]:
    """As the real every-step recording: a minute of start-up (memory held, no kernels), a first step,
    then ``steps`` saves of 12-20 s (the last three longer, 30-45 s: saves grow, as on the real
    recording) each followed by a compute burst of ``burst_s``; ``writer`` writes. No GPU ever reaches
    the compute band: the bursts are all the progress there is."""
    rng = np.random.default_rng(seed)
    waits = _waits(rng, steps, 12.0, 20.0)
    for k in range(max(0, steps - 3), steps):
        waits[k] = float(rng.uniform(30.0, 45.0))
    phases = [
        Phase("startup", 60.0, LOADING, job_phase="init"),
        Phase(
            "step",
            burst_s,
            BURST,
            step_rate_per_s=1.0 / burst_s,
            overrides=((frozenset({writer}), WRITER_BURST),),
        ),
    ]
    for k, wait_s in enumerate(waits):
        phases.append(
            Phase(
                f"save{k}", wait_s, SPIN, job_phase="checkpoint", overrides=((frozenset({writer}), WRITER),)
            )
        )
        phases.append(
            Phase(
                f"step{k}",
                burst_s,
                BURST,
                step_rate_per_s=1.0 / burst_s,
                overrides=((frozenset({writer}), WRITER_BURST),),
            )
        )
    return phases


def _scenario(phases: list[Phase], gpus: int = 8) -> Scenario:
    return Scenario.from_phases(phases, model="H100", power_limit_w=700.0, gpus=gpus, sample_rate_hz=10.0)


def _write(folder: Path, name: str, phases: list[Phase], rate_hz: float, seed: int = 0) -> Path:
    path = folder / f"{name}.csv"
    if not path.exists():
        scenario = _scenario(phases)
        write_nvsmi_csv(path, scenario, scenario.duration_s, rate_hz=rate_hz, with_index=True, seed=seed)
    return path


def _start_of(phases: list[Phase], name: str) -> float:
    t = 0.0
    for p in phases:
        if p.name == name:
            return t
        t += p.duration_s
    raise KeyError(name)


# -- the shapes -------------------------------------------------------------------------------------


def ckpt_every_step() -> list[Phase]:
    return [*every_step_phases(30), Phase("done", 30.0, IDLE, job_phase="idle")]


def ckpt_every_step_then_hang() -> list[Phase]:
    return [*every_step_phases(30, seed=1), Phase("hang", 600.0, SPIN)]


def ckpt_every_step_then_endless_save() -> list[Phase]:
    """The writer never finishes: GPU 0 at low utilisation, the others spinning, for 15 minutes."""
    return [
        *every_step_phases(30, seed=2),
        Phase("endless-save", 900.0, SPIN, job_phase="checkpoint", overrides=((frozenset({0}), WRITER),)),
    ]


def long_saves(count: int = 3, seed: int = 3) -> list[Phase]:
    """Training, then ``count`` remote saves of 380-420 s (every GPU waits), training after each."""
    rng = np.random.default_rng(seed)
    phases = [Phase("train0", 300.0, TRAIN, step_rate_per_s=0.2)]
    for k, save_s in enumerate(_waits(rng, count, 380.0, 420.0)):
        phases.append(Phase(f"save{k}", save_s, SPIN, job_phase="checkpoint"))
        phases.append(Phase(f"train{k + 1}", 300.0, TRAIN, step_rate_per_s=0.2))
    return phases


def long_saves_cut_mid_save() -> list[Phase]:
    """Three long saves, then the recording stops 450 s into a fourth (the writer is slow today)."""
    return [*long_saves(3, seed=4), Phase("save3", 450.0, SPIN, job_phase="checkpoint")]


def long_saves_then_hang() -> list[Phase]:
    return [*long_saves(3, seed=5), Phase("hang", 1200.0, SPIN)]


def long_saves_then_short_hang() -> list[Phase]:
    """Three ~400 s saves, then a hang the recording holds for only 700 s: less than twice the longest
    save, so triage cannot tell it from a slow save of this job (a known limit)."""
    return [*long_saves(3, seed=7), Phase("hang", 700.0, SPIN)]


def two_jobs_one_hung() -> list[Phase]:
    """GPUs 0-3 checkpoint every step (writer GPU 0); GPUs 4-7 are another job, hung from the first
    save on (60.5 s)."""
    hung = frozenset({4, 5, 6, 7})
    phases = []
    for p in every_step_phases(25, seed=6):
        overrides = p.overrides if p.name in ("startup", "step") else (*p.overrides, (hung, SPIN))
        phases.append(Phase(p.name, p.duration_s, p.default, p.job_phase, p.step_rate_per_s, overrides))
    return phases


def edge_hang() -> list[Phase]:
    """A hang whose flat spin draw sits just under the band's ceiling (0.29 of the limit)."""
    return [Phase("train", 300.0, TRAIN, step_rate_per_s=0.2), Phase("hang", 500.0, EDGE_SPIN)]


def _generated(
    name: str,
    shape: Callable[[], list[Phase]],
    rate_hz: float,
    hang: str | None,
    gpus: range | tuple[int, ...] = range(8),
    note: str = "",
    limit: str = "",
) -> Case:
    phases = shape()
    hangs = (Hang(tuple(gpus), _start_of(phases, hang)),) if hang else ()
    return Case(name, lambda folder: _write(folder, name, phases, rate_hz), hangs, note=note, limit=limit)


def generated_cases() -> list[Case]:
    return [
        _generated("ckpt-every-step", ckpt_every_step, 10.0, None, note="saves with bursts between: no hang"),
        _generated("ckpt-every-step+hang", ckpt_every_step_then_hang, 10.0, "hang"),
        _generated(
            "ckpt-every-step+endless-save",
            ckpt_every_step_then_endless_save,
            10.0,
            "endless-save",
            range(1, 8),
        ),
        _generated("long-remote-saves", long_saves, 2.0, None, note="400 s saves, every GPU waits: no hang"),
        _generated("long-remote-saves-cut-mid-save", long_saves_cut_mid_save, 2.0, None),
        _generated("long-remote-saves+hang", long_saves_then_hang, 2.0, "hang"),
        _generated(
            "long-remote-saves+short-hang",
            long_saves_then_short_hang,
            2.0,
            "hang",
            limit="the hang lasts 700 s of the recording, under 2x this job's longest save (~400 s): "
            "as long as a slow save could be, so it is not suspected",
        ),
        _generated("two-jobs-one-hung", two_jobs_one_hung, 10.0, "save0", (4, 5, 6, 7)),
        _generated("hang-at-band-edge", edge_hang, 2.0, "hang"),
        _generated(
            "symmetric-hang",
            lambda: [Phase("train", 600.0, TRAIN, step_rate_per_s=0.2), Phase("hang", 900.0, SPIN)],
            2.0,
            "hang",
        ),
        _generated(
            "slow-local-save-with-writer",
            lambda: [
                Phase("train", 300.0, TRAIN, step_rate_per_s=0.2),
                Phase("save", 500.0, SPIN, job_phase="checkpoint", overrides=((frozenset({0}), WRITER),)),
            ],
            2.0,
            None,
            note="a first save with its writer beside: nothing to compare it with, excused",
        ),
    ]


# -- the real recordings ----------------------------------------------------------------------------

#: GPU count and power limit per file, as ../shared/traces/README.md states them.
REAL = {
    "titanx-2gpu-a.csv": (2, 250.0, None),
    "titanx-2gpu-b.csv": (2, 250.0, None),
    "titanx-2gpu-burn.csv": (2, 250.0, None),
    "h100-8gpu-ckpt100.csv": (8, 700.0, "H100"),
    "h100-8gpu-ckpt1000.csv": (8, 700.0, "H100"),
}


def labels_of(path: Path) -> tuple[tuple[float, float], ...]:
    labels = path.with_name(path.name.replace(".csv", ".labels.csv"))
    if not labels.exists():
        return ()
    with labels.open() as f:
        return tuple((float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f))


def real_cases(traces: Path) -> list[Case]:
    """Every real recording in ``traces`` (healthy: none of them holds a hang)."""
    cases = []
    for path in sorted(traces.glob("*.csv")):
        if path.name.endswith(".labels.csv"):
            continue
        gpus, limit, model = REAL.get(path.name, (None, None, None))
        options: dict[str, object] = {"gpus": gpus, "power_limit_w": limit, "model": model}
        cases.append(
            Case(
                f"real:{path.name}",
                lambda _folder, p=path: p,
                (),
                {k: v for k, v in options.items() if v is not None},
                labels_of(path),
            )
        )
    return cases
