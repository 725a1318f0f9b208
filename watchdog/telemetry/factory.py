"""Turn a ``--source`` spec into a telemetry source.

Forms (the daemon's ``--source`` flag and the config's ``source`` key):

=====================  ==================================================================================
``nvml``               the NVIDIA management library; fails (TelemetryUnavailable) when it does not load
``sim``                the simulated scenario ``sim_scenario`` (default: the built-in ``reference-b300``)
``sim:NAME``           a built-in scenario by name, or ``sim:PATH.toml`` a scenario file
``replay:FILE``        an nvidia-smi CSV recording replayed in time
``none``               no GPU telemetry (progress and process signals only)
``auto``               ``nvml`` when the library loads, else ``none`` with a warning - *never* ``sim``:
                       a production node must not report simulated data
=====================  ==================================================================================

Heavy or optional modules (the NVML binding, the replay reader and its pyarrow) are imported only
for the form that needs them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_triage.model.samples import TelemetrySource, TelemetryUnavailable
from gpu_triage.telemetry.none import NoneSource

if TYPE_CHECKING:
    from gpu_triage.telemetry.sim import Scenario

__all__ = ["SOURCE_FORMS", "make_source"]

SOURCE_FORMS = ("nvml", "sim", "sim:NAME|PATH", "replay:FILE", "none", "auto")
_LOG = logging.getLogger("gpu_triage.telemetry")


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"bad telemetry source {spec!r}: {why}; expected one of: {', '.join(SOURCE_FORMS)}")


def make_source(
    spec: str,
    *,
    deadline_s: float = 0.5,
    pids_interval_s: float = 1.0,
    sim_scenario: Scenario | str | Path | None = None,
    sim_gpus: int | None = None,
    sim_seed: int = 0,
    log: logging.Logger | None = None,
) -> TelemetrySource:
    """The source ``spec`` names (see the module docstring for the forms).

    ``deadline_s`` bounds every NVML call; ``pids_interval_s``: how often NVML lists each GPU's
    processes (the daemon's process period). ``sim_scenario`` is used by a bare ``sim`` (a ``sim:NAME``
    spec takes precedence); ``sim_gpus``/``sim_seed`` shape the simulation. Raises ValueError for a
    malformed spec and TelemetryUnavailable when the named source cannot start (``auto`` never
    raises for a missing NVML: it falls back to ``none`` and logs a warning on ``log``).
    """
    log = log or _LOG
    if not isinstance(spec, str) or not spec.strip():
        raise _bad(str(spec), "empty")
    spec = spec.strip()
    kind, sep, arg = spec.partition(":")
    kind = kind.lower()

    if kind in ("nvml", "none", "auto") and sep:
        raise _bad(spec, f"'{kind}' takes no argument")
    if kind == "nvml":
        from gpu_triage.telemetry.nvml import NvmlSource

        return NvmlSource(deadline_s=deadline_s, pids_interval_s=pids_interval_s)
    if kind == "none":
        return NoneSource()
    if kind == "auto":
        from gpu_triage.telemetry.nvml import NvmlSource

        try:
            return NvmlSource(deadline_s=deadline_s, pids_interval_s=pids_interval_s)
        except TelemetryUnavailable as exc:
            log.warning(
                "no NVIDIA management library (%s): running with --source none, without GPU telemetry "
                "(progress and process signals only). Use --source sim for a demo.",
                exc,
            )
            return NoneSource(reason=str(exc))
    if kind == "sim":
        from gpu_triage.telemetry.scenarios import DEFAULT_SCENARIO
        from gpu_triage.telemetry.sim import SimSource

        if sep and not arg:
            raise _bad(spec, "'sim:' needs a scenario name or a .toml path")
        scenario = arg if sep else (sim_scenario if sim_scenario is not None else DEFAULT_SCENARIO)
        return SimSource(scenario, gpus=sim_gpus, seed=sim_seed)
    if kind == "replay":
        if not sep or not arg:
            raise _bad(spec, "'replay' needs a file: replay:FILE")
        path = Path(arg).expanduser()
        if not path.is_file():
            raise TelemetryUnavailable(f"replay file {path} does not exist")
        from gpu_triage.telemetry.replay import ReplaySource

        return ReplaySource(path)
    raise _bad(spec, f"unknown kind {kind!r}")
