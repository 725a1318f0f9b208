"""Text rendering of power tables (``gpu-watchdog tables``)."""

from __future__ import annotations

import math

from gpu_triage.classify.power_table import BAND_ORDER, PowerTable


def _rng(lo: float, hi: float, scale: float | None, unit: str, pct: bool = False) -> str:
    def f(v: float) -> str:
        if pct:
            return f"{100 * v:.0f}%"
        return f"{v:.2f}" + (f" ({v * scale:.0f} {unit})" if scale else "")

    if lo <= 0 and math.isinf(hi):
        return "any"
    if lo <= 0:
        return f"< {f(hi)}"
    if math.isinf(hi) or (pct and hi > 1.0):
        return f">= {f(lo)}"
    return f"{f(lo)} .. {f(hi)}"


def render_table(t: PowerTable) -> str:
    lim = t.power_limit_w
    head = f"{t.model}: {t.description}; limit " + (f"{lim:.0f} W" if lim else "from NVML / --power-limit")
    lines = [head, f"  matches device names containing: {', '.join(t.match) or '(fallback for any GPU)'}"]
    lines.append(
        f"  {'state':<24}{'power (fraction of limit)':<30}{'utilisation':<14}{'exit margin':<16}"
        f"{'dwell':>6}  source"
    )
    for s in BAND_ORDER:
        b = t.bands[s]
        margin = f"±{b.margin_power:.2f} / ±{100 * b.margin_util:.0f}%"
        lines.append(
            f"  {s!s:<24}{_rng(b.power_min, b.power_max, lim, 'W'):<30}"
            f"{_rng(b.util_min, b.util_max, None, '', pct=True):<14}{margin:<16}{b.dwell_s:>5.1f}s  "
            f"{'[estimate] ' if b.estimate else ''}{b.note}"
        )
    lines.append(
        f"  without utilisation: idle below {t.idle_power_max:.2f} of the limit"
        + (f" ({t.idle_power_max * lim:.0f} W)" if lim else "")
        + f"; {t.notes.get('power_only', '')}"
    )
    if t.notes.get("power_limit"):
        lines.append(f"  limit: {t.notes['power_limit']}")
    return "\n".join(lines)


def render_tables(tables: list[PowerTable]) -> str:
    return "\n\n".join(render_table(t) for t in tables)
