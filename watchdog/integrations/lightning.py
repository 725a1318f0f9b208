"""Lightning integration: one ``Callback``.

::

    from gpu_triage.integrations.lightning import WatchdogCallback

    trainer = L.Trainer(strategy="ddp", devices=8, callbacks=[WatchdogCallback("my-job")])
    trainer.fit(model, datamodule)

What it writes, on every rank (``lease_scope = "job"``: Lightning runs validation and
``Trainer.save_checkpoint`` on every rank):

- ``init`` (a lease) from ``setup`` (ranks known) until ``on_train_start``;
- ``train`` with ``trainer.global_step`` after every training batch;
- ``eval`` from ``on_validation_start`` to ``on_validation_end`` (the sanity check included);
- ``checkpoint`` around every ``trainer.save_checkpoint`` call (``ModelCheckpoint``'s saves and your
  own): Lightning has a hook before a save but none after one, so the callback wraps the trainer's
  ``save_checkpoint`` for the run and restores it at ``teardown``;
- ``done`` at ``on_train_end``.

Works with both distributions: ``lightning`` (``import lightning.pytorch``) and ``pytorch-lightning``
(``import pytorch_lightning``); the base class is the one your code imported (``lightning.pytorch``
when both are loaded or neither is). Importing this module imports Lightning; the rest of
``gpu_triage`` never does.
"""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path
from typing import Any

from gpu_triage.contract import LeasePolicy
from gpu_triage.integrations.loop import Progress

__all__ = ["WatchdogCallback"]


def _lightning_module() -> Any:
    """``lightning.pytorch`` or ``pytorch_lightning``: the one already imported, else whichever exists."""
    if "pytorch_lightning" in sys.modules and "lightning.pytorch" not in sys.modules:
        return sys.modules["pytorch_lightning"]
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return importlib.import_module("pytorch_lightning")


_L = _lightning_module()


class WatchdogCallback(_L.Callback):  # type: ignore[misc,name-defined]
    """Writes this rank's progress file for the watchdog. ``job`` defaults to ``$GPU_WATCHDOG_JOB``,
    ``directory`` to ``$GPU_WATCHDOG_PROGRESS_DIR``; ranks come from the Lightning trainer."""

    def __init__(
        self,
        job: str | None = None,
        *,
        directory: Path | str | None = None,
        policy: LeasePolicy | None = None,
        lease_scope: str = "job",
    ) -> None:
        super().__init__()
        self.job = job
        self.directory = directory
        self.policy = policy
        self.lease_scope = lease_scope
        self.progress: Progress | None = None
        self._wrapped: tuple[Any, Any] | None = None

    def _ensure(self, trainer: Any) -> Progress:
        if self.progress is None:
            self.progress = Progress.for_rank(
                self.job,
                int(trainer.global_rank),
                int(trainer.local_rank),
                int(trainer.world_size),
                directory=self.directory,
                policy=self.policy,
                lease_scope=self.lease_scope,
            )
        return self.progress

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        p = self._ensure(trainer)
        if self._wrapped is None:
            original = trainer.save_checkpoint

            @functools.wraps(original)
            def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
                with p.checkpoint():
                    return original(*args, **kwargs)

            trainer.save_checkpoint = save_checkpoint
            self._wrapped = (trainer, original)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._wrapped is not None:
            wrapped_trainer, _original = self._wrapped
            # drop the instance attribute: the class's method shows through again
            wrapped_trainer.__dict__.pop("save_checkpoint", None)
            self._wrapped = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure(trainer).train(int(trainer.global_step), epoch=int(trainer.current_epoch))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._ensure(trainer).step(int(trainer.global_step), epoch=int(trainer.current_epoch))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure(trainer).begin("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._ensure(trainer).end("eval")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._ensure(trainer).done(int(trainer.global_step), epoch=int(trainer.current_epoch))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.progress is not None:
            self.progress.close(done=False)
