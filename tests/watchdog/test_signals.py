"""One interface for signals (gpu_triage.signals.signal) and one registry: a signal registered with
``@register`` is built by the daemon from its section, run every process period with what the
daemon knows of each job, its facts handed to the detector, its status published, rebuilt when its
section changes on reload and closed at shutdown - with no line of the daemon naming it. A signal
that raises, or sets what a signal may not, loses its own facts and no other's."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpu_triage.contract import ProgressWriter
from gpu_triage.daemon.config import load_config
from gpu_triage.daemon.loop import Daemon
from gpu_triage.daemon.observe import Observer, SignalSet
from gpu_triage.serving.api import status_document
from gpu_triage.serving.status_doc import StatusDoc
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.nccl_ras.poller import RasConfig
from gpu_triage.signals.registry import signal_kinds
from gpu_triage.signals.signal import Contribution, JobSight, SignalEnv, register, registered, unregister
from gpu_triage.telemetry.none import NoneSource

JOB = "probe-job"


class Probe:
    """A signal as a new one would be written: a class with the interface, registered by name."""

    built: ClassVar[list[Probe]] = []

    def __init__(self, settings: RasConfig, env: SignalEnv) -> None:
        self.settings = settings
        self.env = env
        self.seen: list[tuple[float, tuple[JobSight, ...]]] = []
        self.closed = False
        Probe.built.append(self)

    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        self.seen.append((now, tuple(jobs)))
        return {j.job: {"remote": RemoteFacts(j.job, now, error="from the probe", asked=False)} for j in jobs}

    def status(self) -> Mapping[str, Any]:
        return {"min_interval_s": self.settings.min_interval_s, "calls": len(self.seen)}

    def reload(self, settings: RasConfig, env: SignalEnv) -> Probe:
        self.close()
        return Probe(settings, env)

    def close(self) -> None:
        self.closed = True


class Broken(Probe):
    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        raise RuntimeError("the probe's hardware is gone")


class Usurper(Probe):
    def contribute(self, now: float, jobs: Sequence[JobSight]) -> Mapping[str, Contribution]:
        return {j.job: {"ranks": ()} for j in jobs}


@pytest.fixture
def probe() -> Iterator[type[Probe]]:
    Probe.built = []
    register("probe", section="ras", reads=("stacks",))(Probe)
    try:
        yield Probe
    finally:
        unregister("probe")


def write_progress(tmp_path: Path) -> None:
    writer = ProgressWriter(JOB, rank=0, local_rank=0, world_size=2, directory=tmp_path / "progress")
    writer.phase("train")
    writer.step(3)


def write_config(path: Path, tmp_path: Path, min_interval_s: float) -> Path:
    path.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[progress]\ndir = "{tmp_path / "progress"}"\n'
        f"[ras]\nmin_interval_s = {min_interval_s}\n"
    )
    return path


def test_a_registered_signal_is_built_run_reported_reloaded_and_closed(tmp_path: Path, probe: type[Probe]):
    write_progress(tmp_path)
    path = write_config(tmp_path / "watchdog.toml", tmp_path, 60.0)
    daemon = Daemon(load_config(path, {}), NoneSource(), config_path=path, serve_http=False)
    daemon.start()
    try:
        (first,) = probe.built
        assert first.env.node == daemon.node and first.settings.min_interval_s == 60.0
        now = time.time()
        snap = daemon.cycle(now)
        ((seen_at, sights),) = first.seen
        assert seen_at == now
        (sight,) = [s for s in sights if s.job == JOB]  # (other jobs of this machine's users may show)
        assert sight.job == JOB and sight.world_size == 2 and sight.has_progress and sight.ranks_here == 1
        assert not sight.suspect and sight.gpus == frozenset()  # no GPU: the none source
        assert "stacks" in sight.facts  # it reads the stacks: they ran first and their facts are its
        # its status is published by name; the built-in ones where they always were
        assert snap.signals["probe"] == {"min_interval_s": 60.0, "calls": 1}
        doc = status_document(snap)
        assert doc["signals"]["probe"]["calls"] == 1
        StatusDoc.model_validate(doc)  # the documented /status shape (OpenAPI) holds it
        assert doc["stacks"]["state"] and "polls_total" in doc["stacks"]["nccl_ras"]
        assert "queries_total" in doc["cluster"] or doc["cluster"]["prometheus_url"] is None

        daemon.reload()  # the same section: the same signal
        assert probe.built == [first] and not first.closed
        write_config(path, tmp_path, 120.0)
        daemon.reload()  # its section changed: it reloads (here: closed and built again)
        assert first.closed
        second = probe.built[-1]
        assert second is not first and second.settings.min_interval_s == 120.0
        daemon.cycle(now + 30)
        assert len(second.seen) == 1 and len(first.seen) == 1
    finally:
        daemon.close()
    assert second.closed


def test_the_signals_status_is_asked_each_process_period_not_each_cycle(tmp_path: Path, probe: type[Probe]):
    # issue 30: 10 cycles a second, the signals' facts (and so their status) once a second
    asked: list[float] = []
    status = Probe.status

    def counted(self: Probe) -> Mapping[str, Any]:
        asked.append(time.monotonic())
        return status(self)

    path = write_config(tmp_path / "watchdog.toml", tmp_path, 60.0)
    daemon = Daemon(load_config(path, {}), NoneSource(), config_path=path, serve_http=False)
    probe.status = counted  # type: ignore[method-assign]
    try:
        daemon.start()
        now = time.time()
        snaps = [daemon.cycle(now + 0.1 * i) for i in range(25)]  # process period 1 s: 3 of them
        assert len(asked) == 3
        assert all(s.signals["probe"]["min_interval_s"] == 60.0 for s in snaps)  # in every snapshot
        assert snaps[-1].signals["probe"]["calls"] == 3
        daemon.reload()
        daemon.cycle(now + 2.6)  # not a process period, but a reloaded signal reports afresh
        assert len(asked) == 4
    finally:
        probe.status = status  # type: ignore[method-assign]
        daemon.close()


def test_the_signals_facts_reach_the_job_views(tmp_path: Path, probe: type[Probe]):
    write_progress(tmp_path)
    path = write_config(tmp_path / "watchdog.toml", tmp_path, 60.0)
    config = load_config(path, {})
    from gpu_triage.classify.tracker import GpuTracker

    observer = Observer(config, GpuTracker(), SignalEnv("node-x", time.time))
    try:
        _, jobs = observer.observe(time.time(), [], [], wall=None, verdicts={}, signalled=None)
    finally:
        observer.close()
    (job,) = [j for j in jobs if j.job == JOB]
    assert job.remote is not None and job.remote.error == "from the probe"


def test_a_failing_signal_blinds_no_other(tmp_path: Path, probe: type[Probe]):
    register("broken", section="ras")(Broken)
    try:
        write_progress(tmp_path)
        path = write_config(tmp_path / "watchdog.toml", tmp_path, 60.0)
        daemon = Daemon(load_config(path, {}), NoneSource(), serve_http=False)
        daemon.start()
        try:
            snap = daemon.cycle(time.time())
        finally:
            daemon.close()
    finally:
        unregister("broken")
    (healthy,) = [p for p in probe.built if type(p) is Probe]
    assert len(healthy.seen) == 1  # the probe still ran
    errors = [e for e in snap.input_errors if e["kind"] == "signal"]
    assert errors == [
        {"kind": "signal", "where": "broken", "error": "RuntimeError: the probe's hardware is gone"}
    ]
    assert snap.counters["degraded_cycles_total"] >= 1.0
    assert JOB in {j.job for j in snap.jobs}  # the job is still judged


def test_a_signal_cannot_overwrite_what_the_job_is(tmp_path: Path):
    register("usurper", section="ras")(Usurper)
    try:
        config = load_config(None, {})
        kinds = [k for k in registered() if k.name == "usurper"]
        signals = SignalSet(config, SignalEnv(), kinds)
        sight = JobSight(JOB, {0: 1}, 1, 2, 2, True, False)
        assert signals.contribute(0.0, [sight]) == {JOB: {}}
        assert "ranks" in signals.errors["usurper"]
    finally:
        unregister("usurper")


def test_signals_run_after_those_whose_facts_they_read():
    names = [k.name for k in signal_kinds()]
    assert {"stacks", "nccl_ras", "fleet", "health"} <= set(names)
    assert names.index("stacks") < names.index("nccl_ras")  # RAS reads the stacks' facts
    register("late", section="ras", reads=("zzz",))(Probe)
    register("zzz", section="ras")(Probe)
    try:
        order = [k.name for k in registered()]
        assert order.index("zzz") < order.index("late")
    finally:
        unregister("late")
        unregister("zzz")
    with pytest.raises(ValueError, match="already registered"):
        register("stacks", section="stacks")(Probe)
