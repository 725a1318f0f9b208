"""accelerate integration: saves and loads under leases, steps from your loop.

::

    from accelerate import Accelerator
    from gpu_triage.integrations.accelerate import watch

    accelerator = Accelerator()
    progress = watch(accelerator, "my-job")       # init until progress.train()
    model, opt, loader = accelerator.prepare(model, opt, loader)
    progress.train()
    for step, batch in enumerate(loader, 1):
        ...
        progress.step(step, epoch=epoch)
        if step % 500 == 0:
            accelerator.save_state("ckpt")          # announced as checkpoint, on every rank
    progress.close()                               # done

:func:`watch` builds a :class:`~gpu_triage.integrations.loop.Progress` from the accelerator's ranks
(``process_index``, ``local_process_index``, ``num_processes``) and puts every
``accelerator.save_state`` under a ``checkpoint`` lease and every ``load_state`` (a resume) under an
``init`` lease. accelerate's save/load hooks (``register_save_state_pre_hook``) run only *before* a save,
so the end of one is seen by wrapping the two methods on this accelerator instance (undone by
:func:`unwatch`). Importing this module does not import accelerate; :func:`watch` uses the object given.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

from gpu_triage.contract import LeasePolicy
from gpu_triage.integrations.loop import Progress

__all__ = ["unwatch", "watch"]

_ATTR = "_gpu_watchdog_progress"


def watch(
    accelerator: Any,
    job: str | None = None,
    *,
    directory: Path | str | None = None,
    policy: LeasePolicy | None = None,
    lease_scope: str = "job",
) -> Progress:
    """Start this rank's progress file (phase ``init``) and announce the accelerator's saves and loads.
    Call it on every rank (``save_state`` is called on every rank). Returns the :class:`Progress` whose
    :meth:`~Progress.step` your loop calls; calling it again returns the same one."""
    existing = accelerator.__dict__.get(_ATTR)
    if existing is not None:
        return cast(Progress, existing)
    progress = Progress.for_rank(
        job,
        int(accelerator.process_index),
        int(accelerator.local_process_index),
        int(accelerator.num_processes),
        directory=directory,
        policy=policy,
        lease_scope=lease_scope,
    )
    for name, phase in (("save_state", "checkpoint"), ("load_state", "init")):
        original = getattr(accelerator, name)

        def wrapped(*args: Any, _original: Any = original, _phase: str = phase, **kwargs: Any) -> Any:
            with progress.phase(_phase):
                return _original(*args, **kwargs)

        setattr(accelerator, name, functools.wraps(original)(wrapped))
    accelerator.__dict__[_ATTR] = progress
    return progress


def unwatch(accelerator: Any, *, done: bool = True) -> None:
    """Restore ``save_state``/``load_state`` and close the progress session (``done`` by default)."""
    progress = accelerator.__dict__.pop(_ATTR, None)
    for name in ("save_state", "load_state"):
        accelerator.__dict__.pop(name, None)
    if progress is not None:
        progress.close(done=done)
