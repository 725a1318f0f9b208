"""gpu-triage's watchdog: GPU power-band classification, deadlock detection and offline triage.

The import name ``watchdog`` is shared with PyPI's unrelated filesystem-events package. Two
distributions shipping the same top-level package overwrite each other, so install this project into
its own virtual environment (the systemd unit does). :func:`assert_ours` is called at start-up by the
CLI to fail clearly when the ``watchdog`` on ``sys.path`` is the other one.
"""

from __future__ import annotations

__version__ = "0.1.0"
#: Marker checked at start-up; the filesystem-events ``watchdog`` has no such attribute.
DISTRIBUTION = "gpu-triage"


def assert_ours() -> None:
    """Raise ImportError if ``import watchdog`` does not resolve to this project."""
    import watchdog as imported

    if getattr(imported, "DISTRIBUTION", None) != DISTRIBUTION:
        raise ImportError(
            f"the 'watchdog' package imported from {getattr(imported, '__file__', '?')} is not gpu-triage's "
            "(PyPI's filesystem-events 'watchdog' shares the name); install gpu-triage into its own "
            "virtual environment"
        )
