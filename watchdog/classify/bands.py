"""Which band a sample falls in, for one sample (the daemon) or a whole array (triage).

``power_frac`` is board power divided by the enforced power limit; ``util`` is a ratio 0..1. A NaN
power means the read failed (state ``unknown``). A NaN utilisation (a recording without that column,
or NVML not answering it) switches to the power-only rule of the table: below ``idle_power_max`` idle,
below the checkpoint band's ``power_max`` checkpoint_or_deadlock, below compute communication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpu_triage.classify.power_table import BAND_ORDER, Box, PowerTable
from gpu_triage.model.states import GPU_STATES, GpuState

#: Integer codes of states in arrays: index into GPU_STATES.
CODE: dict[GpuState, int] = {s: i for i, s in enumerate(GPU_STATES)}
UNKNOWN_CODE = CODE[GpuState.UNKNOWN]


def _in_boxes(p: float, u: float, boxes: Sequence[Box]) -> bool:
    return any(b[0] <= p < b[1] and b[2] <= u < b[3] for b in boxes)


def _mask(power_frac: np.ndarray, util: np.ndarray, boxes: Sequence[Box]) -> np.ndarray:
    out = np.zeros(power_frac.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        for lo_p, hi_p, lo_u, hi_u in boxes:
            out |= (power_frac >= lo_p) & (power_frac < hi_p) & (util >= lo_u) & (util < hi_u)
    return out


def raw_state(table: PowerTable, power_frac: float, util: float) -> GpuState:
    """The first band (in priority order) whose enter box holds the sample."""
    if math.isnan(power_frac):
        return GpuState.UNKNOWN
    if math.isnan(util):
        return _power_only(table, power_frac)
    for state in BAND_ORDER:
        if _in_boxes(power_frac, util, table.bands[state].enter_boxes()):
            return state
    return GpuState.UNKNOWN


def _power_only(table: PowerTable, p: float) -> GpuState:
    if p >= table.bands[GpuState.COMPUTE].power_min:
        return GpuState.COMPUTE
    if p < table.idle_power_max:
        return GpuState.IDLE
    if p < table.bands[GpuState.CHECKPOINT_OR_DEADLOCK].power_max:
        return GpuState.CHECKPOINT_OR_DEADLOCK
    return GpuState.COMMUNICATION


def stays_in(table: PowerTable, state: GpuState, power_frac: float, util: float) -> bool:
    """True when a GPU already in ``state`` keeps it for this sample (inside the widened exit box)."""
    if state is GpuState.UNKNOWN:
        return math.isnan(power_frac)
    if math.isnan(power_frac):
        return False
    if math.isnan(util):
        return _power_only(table, power_frac) is state
    return _in_boxes(power_frac, util, table.bands[state].exit_boxes())


def raw_states(table: PowerTable, power_frac: np.ndarray, util: np.ndarray) -> np.ndarray:
    """Vectorised :func:`raw_state`: int8 codes (index into ``GPU_STATES``)."""
    out = np.full(power_frac.shape, UNKNOWN_CODE, dtype=np.int8)
    p_ok = ~np.isnan(power_frac)
    u_nan = np.isnan(util)
    undecided = p_ok & ~u_nan
    for state in BAND_ORDER:  # first match wins, so fill only still-undecided samples
        hit = undecided & _mask(power_frac, util, table.bands[state].enter_boxes())
        out[hit] = CODE[state]
        undecided &= ~hit
    po = p_ok & u_nan
    if po.any():
        out[po] = _power_only_codes(table, power_frac[po])
    return out


def _power_only_codes(table: PowerTable, p: np.ndarray) -> np.ndarray:
    compute_min = table.bands[GpuState.COMPUTE].power_min
    spin_max = table.bands[GpuState.CHECKPOINT_OR_DEADLOCK].power_max
    return np.select(
        [p >= compute_min, p < table.idle_power_max, p < spin_max],
        [CODE[GpuState.COMPUTE], CODE[GpuState.IDLE], CODE[GpuState.CHECKPOINT_OR_DEADLOCK]],
        default=CODE[GpuState.COMMUNICATION],
    ).astype(np.int8)


def stays_mask(
    table: PowerTable, state: GpuState, power_frac: np.ndarray, util: np.ndarray, raw: np.ndarray
) -> np.ndarray:
    """Vectorised :func:`stays_in` (``raw`` from :func:`raw_states`, reused for the power-only case)."""
    if state is GpuState.UNKNOWN:
        return np.asarray(np.isnan(power_frac))
    inside = _mask(power_frac, util, table.bands[state].exit_boxes())
    po = np.isnan(util) & ~np.isnan(power_frac)
    return np.where(po, raw == CODE[state], inside)
