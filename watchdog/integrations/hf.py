"""Hugging Face ``transformers.Trainer`` integration: one callback.

::

    from gpu_triage.integrations.hf import WatchdogCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[WatchdogCallback("my-job")])
    trainer.train()

What it writes, on every rank (the Trainer runs saves and evaluations on every rank, so the leases are
``lease_scope = "job"``):

- ``init`` (a lease) from the end of ``Trainer.__init__`` until training starts;
- ``train`` with ``state.global_step`` (and ``num_input_tokens_seen`` when the Trainer counts tokens)
  after every optimizer step;
- ``eval`` when ``control.should_evaluate`` is set at a step or epoch end, until ``on_evaluate``;
- ``checkpoint`` when ``control.should_save`` is set, announced in ``on_step_end``/``on_epoch_end``
  *before* the save starts (``on_save`` fires after the save), until ``on_save``;
- ``done`` at ``on_train_end``.

Leases come from the measured durations of earlier evaluations and saves
(:class:`~gpu_triage.contract.LeaseEstimator`); a background flusher keeps the file current while a
rank sits in a long collective. Importing this module imports ``transformers``; the rest of
``gpu_triage`` never does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from gpu_triage.contract import LeasePolicy
from gpu_triage.integrations.loop import Progress

__all__ = ["WatchdogCallback"]


class WatchdogCallback(TrainerCallback):
    """Writes this rank's progress file for the watchdog. ``job`` defaults to ``$GPU_WATCHDOG_JOB``,
    ``directory`` to ``$GPU_WATCHDOG_PROGRESS_DIR``; ranks come from the Trainer's arguments."""

    def __init__(
        self,
        job: str | None = None,
        *,
        directory: Path | str | None = None,
        policy: LeasePolicy | None = None,
        lease_scope: str = "job",
    ) -> None:
        self.job = job
        self.directory = directory
        self.policy = policy
        self.lease_scope = lease_scope
        self.progress: Progress | None = None

    # -- set-up ---------------------------------------------------------------------------------
    def _ensure(self, args: Any) -> Progress:
        if self.progress is None:
            self.progress = Progress.for_rank(
                self.job,
                int(args.process_index),
                int(args.local_process_index),
                int(args.world_size),
                directory=self.directory,
                policy=self.policy,
                lease_scope=self.lease_scope,
            )
        return self.progress

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ensure(args)  # announces init with its lease

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ensure(args).train(int(state.global_step), epoch=int(state.epoch or 0), tokens=_tokens(state))

    # -- steps and phases -----------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a phase left open (a "best" save strategy that decided not to save) ends when steps resume
        p = self._ensure(args)
        while p.end() is not None:
            pass

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        p = self._ensure(args)
        p.step(int(state.global_step), epoch=int(state.epoch or 0), tokens=_tokens(state))
        self._announce(p, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._announce(self._ensure(args), control)

    @staticmethod
    def _announce(p: Progress, control: Any) -> None:
        """What ``_maybe_log_save_evaluate`` is about to do: evaluate first, then save."""
        if control.should_evaluate and not p.in_phase("eval"):
            p.begin("eval")
        elif control.should_save and not p.in_phase("checkpoint"):
            p.begin("checkpoint")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        p = self._ensure(args)
        if p.in_phase("eval"):
            p.end("eval", then="checkpoint" if control.should_save else None)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ensure(args).end("checkpoint")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ensure(args).done(int(state.global_step), epoch=int(state.epoch or 0), tokens=_tokens(state))


def _tokens(state: Any) -> int | None:
    seen = getattr(state, "num_input_tokens_seen", None)
    return int(seen) if isinstance(seen, (int, float)) and seen >= 0 else None
