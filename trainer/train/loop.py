"""The training loop of one rank: DeepSpeed ZeRO-3, equalize-to-minimum, progress leases, checkpoints.

Per epoch, every rank computes the same plan (``JobData.epoch_plan``), agrees on a micro-batch count with
``equalize_epoch`` (all_reduce MIN, rounded down to whole optimizer steps) and runs exactly that many
micro-batches: one ``engine.backward`` / ``engine.step`` per micro-batch, an optimizer step every
``grad_accum``. With ``data.equalize = false`` (tests and the demo only) each rank runs its own count:
a rank with fewer micro-batches reaches the end-of-epoch collective while another still waits in a
forward pass - the epoch-end deadlock, reproduced for real.

What the watchdog sees (``gpu_triage.contract``, ``lease_scope`` "job": every
rank announces every phase): ``init`` with a lease while the model loads, ``train``
with the step after every optimizer step, ``epoch_end`` with a lease around the end-of-epoch collectives
(epoch statistics, equalize of the next epoch), ``checkpoint`` with a lease derived from the measured save
throughput and the checkpoint size, ``done`` at the end. A missing progress directory never stops
training.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from ft_trainer.config import JobConfig
from ft_trainer.data.data import JobData
from ft_trainer.planning.estimates import checkpoint_bytes
from ft_trainer.planning.plan import plan_fingerprint
from ft_trainer.train.checkpoint import (
    FAULT_ENV,
    CheckpointManager,
    duration_lease_s,
    parse_fault,
    save_lease_s,
)
from ft_trainer.train.ds_config import bf16_enabled, build_ds_config, load_override, optimizer_impl
from ft_trainer.train.rank import ProgressReporter, RankEnv, TrainError, resolve_device
from ft_trainer.train.schedule import LrSchedule, total_optimizer_steps
from ft_trainer.train.settings import Settings
from ft_trainer.train.throughput import (
    MetricsLog,
    ThroughputMeter,
    lookup_peak_flops,
    measure_cpu_matmul_flops,
)
from gpu_triage.contract import ProgressWriter, progress_dir

__all__ = ["TrainResult", "Trainer"]

log = logging.getLogger("ft_trainer.train")
STATE_FORMAT = 1


@dataclass
class TrainResult:
    steps: int
    epoch: int
    tokens: int
    last_loss: float | None
    stopped_at_max_steps: bool
    saves: int


class Trainer:
    """One rank of a run. ``setup()`` then ``run()``; see the module docstring."""

    def __init__(self, cfg: JobConfig, settings: Settings, env: Mapping[str, str] | None = None):
        self.cfg = cfg
        self.settings = settings
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.ranks = RankEnv.from_env(self.env)
        self.rank = self.ranks.rank
        self.world = self.ranks.world_size
        self.t_start = time.time()
        self.metrics_dir = settings.metrics_dir(cfg)
        writer = None
        if settings.progress.enabled:
            writer = ProgressWriter(
                settings.progress_job(cfg, self.env),
                self.rank,
                self.ranks.local_rank,
                self.world,
                directory=settings.progress.dir or progress_dir(self.env),
                # every rank announces every collective phase (epoch end, saves), the waiting ranks too
                lease_scope="job",
            )
        history = (
            self.metrics_dir / "progress" / f"rank-{self.rank}.jsonl" if settings.progress.history else None
        )
        self.progress = ProgressReporter(writer, history)
        self.progress.phase("init", lease_s=settings.progress.init_lease_s)
        self.progress.start_flusher()
        # loop state (restored on resume)
        self.step = 0
        self.epoch = 0
        self.micro_in_epoch = 0
        self.tokens = 0  # all ranks, trained on
        self.rank_tokens = 0  # this rank
        self.elapsed_before_s = 0.0
        self.save_bytes: float | None = None
        self.save_bytes_per_s: float | None = None
        self.epoch_end_s: float | None = None
        self.last_saved_step: int | None = None
        self.saves = 0
        self.last_loss: float | None = None
        self.resumed_from: str | None = None
        self._stop = False
        self._micro_in_step = 0
        self._loss_sum: Any = None
        self._loss_n = 0
        self._pending_log: tuple[Any, Any, dict[str, Any]] | None = None
        self._epoch_loss_sum = 0.0
        self._epoch_loss_n = 0
        self._epoch_t0 = 0.0
        self.metrics = MetricsLog(None)

    # ------------------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, s = self.cfg, self.settings
        if self.world != cfg.cluster.world_size:
            raise TrainError(
                f"{cfg.path}: the launcher started {self.world} ranks (WORLD_SIZE) but cluster.world_size is "
                f"{cfg.cluster.world_size}: the data plan is computed for the job's world size; fix the "
                "launch or the job file (and rerun ft-trainer gate)"
            )
        t0 = time.perf_counter()
        torch, deepspeed = self._start_distributed()
        self._seed(cfg.seed)
        self._plan_epochs()

        ds_config = load_override(cfg, s, build_ds_config(cfg, s, device=self.device))
        self.ds_config = ds_config
        if self.rank == 0:
            self.metrics_dir.mkdir(parents=True, exist_ok=True)
            (self.metrics_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=1) + "\n")
            log.info(
                "effective DeepSpeed config (also in %s):\n%s",
                self.metrics_dir / "ds_config.json",
                json.dumps(ds_config, indent=1),
            )
            self.metrics = MetricsLog(self.metrics_dir / "metrics.jsonl")

        from ft_trainer.train.model import build_model

        bf16 = bf16_enabled(s, self.device)
        built = build_model(cfg, s, ds_config, bf16=bf16)
        self._hf_ds_config = built.hf_ds_config
        params = [p for p in built.module.parameters() if p.requires_grad]
        engine, _opt, _, _ = deepspeed.initialize(
            model=built.module, config=ds_config, model_parameters=params
        )
        self.engine = engine
        self.torch = torch
        self.dist = torch.distributed
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=engine.device)

        fault = parse_fault(self.env.get(FAULT_ENV))
        self.ckpt = CheckpointManager(
            cfg.checkpoint.dir,
            engine,
            rank=self.rank,
            world_size=self.world,
            keep_last=cfg.checkpoint.keep_last,
            fault=fault,
        )
        self.ckpt.remove_partial()
        self.dist.barrier()
        if s.train.resume == "auto":
            tag = self.ckpt.latest()
            if tag is not None:
                self._resume(tag)
                self.progress.step(self.step, self.epoch, self.rank_tokens)  # the watchdog sees where we are
                self.elapsed_before_s = max(self.elapsed_before_s, self._logged_elapsed_s())

        peak, peak_source = self._peak_flops()
        self.meter = ThroughputMeter(
            tokens_per_step=cfg.tokens_per_step,
            flops_per_token=cfg.model.spec.flops_per_token(cfg.data.seq_len),
            devices=self.world,
            peak_flops_per_device=peak,
            start_s=self.t_start,
            elapsed_before_s=self.elapsed_before_s,
        )
        if self.rank == 0:
            self._write_run_json(peak, peak_source, init_impl=built.init, bf16=bf16)
            self.metrics.write(
                "start",
                step=self.step,
                epoch=self.epoch,
                micro_batch=self.micro_in_epoch,
                resumed_from=self.resumed_from,
                setup_s=round(time.perf_counter() - t0, 3),
                total_steps=self.schedule.total_steps,
                plan_fingerprint=self.fingerprint,
            )
        log.info(
            "rank %d/%d ready in %.1f s: %s on %s, %d optimizer steps planned (%s per epoch), plan %s%s",
            self.rank,
            self.world,
            time.perf_counter() - t0,
            cfg.model.spec.name,
            self.device,
            self.schedule.total_steps,
            self.steps_per_epoch,
            self.fingerprint,
            f", resumed from {self.resumed_from} at step {self.step}" if self.resumed_from else "",
        )

    def _start_distributed(self) -> tuple[Any, Any]:
        """Pick the device, import torch and DeepSpeed for it and join the process group; the two
        modules."""
        s = self.settings
        self.device = resolve_device(s, self.env)
        if self.device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import torch

        if self.device == "cpu" and s.train.cpu_threads:
            torch.set_num_threads(s.train.cpu_threads)
        import deepspeed

        if self.device == "cpu":
            # DeepSpeed's CPU backend JIT-compiles a shared-memory op used only by inference all-reduce;
            # training never calls it, and skipping it saves a C++ build (~40 s) on every fresh machine.
            import importlib

            # (by module path: the attribute deepspeed.comm.torch is the torch package itself)
            shm_module: Any = importlib.import_module("deepspeed.comm.torch")
            shm_module.build_shm_op = lambda: None
        backend = s.train.dist_backend
        if backend == "auto":
            backend = "nccl" if self.device == "cuda" else "gloo"
        if self.device == "cuda":
            torch.cuda.set_device(self.ranks.local_rank)
        deepspeed.init_distributed(
            dist_backend=backend, timeout=timedelta(seconds=s.train.collective_timeout_s), verbose=False
        )
        return torch, deepspeed

    def _plan_epochs(self) -> None:
        """The data plan of every epoch: steps and tokens per epoch, the LR schedule over the total
        steps, and the plan's fingerprint (the one the gate printed)."""
        cfg, s = self.cfg, self.settings
        self.data = JobData.open(cfg)
        counts, used_tokens = [], []
        plans = []
        for e in range(cfg.epochs):
            plan = self.data.epoch_plan(e)
            plans.append(plan)
            counts.append(int(plan.micro_batches.min()))  # one schedule on every rank, even unequalized
            used_tokens.append(int(plan.used_tokens.sum()))
        self.fingerprint = plan_fingerprint(plans)
        del plans
        self.steps_per_epoch = [c // cfg.data.grad_accum for c in counts]
        self.tokens_per_epoch = used_tokens
        total = s.optim.total_steps or total_optimizer_steps(counts, cfg.data.grad_accum)
        o = s.optim
        self.schedule = LrSchedule.build(
            base_lr=o.lr,
            total_steps=total,
            warmup_steps=o.warmup_steps,
            warmup_ratio=o.warmup_ratio,
            schedule=o.schedule,
            min_lr_ratio=o.min_lr_ratio,
        )

    def _logged_elapsed_s(self) -> float:
        """Wall time the metrics log recorded before this launch (GPU-hours keep counting the time a
        crashed segment ran after its last checkpoint). Rank 0 only; 0 without a log."""
        if self.rank != 0:
            return 0.0
        from ft_trainer.train.throughput import read_metrics

        try:
            records = read_metrics(self.metrics_dir / "metrics.jsonl")
        except (OSError, ValueError):
            return 0.0
        logged = [float(r.get("elapsed_s") or 0.0) for r in records if r.get("kind") == "step"]
        return max(logged, default=0.0)

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        self.torch_seed = seed
        import torch

        torch.manual_seed(seed)

    def _peak_flops(self) -> tuple[float | None, str]:
        m = self.settings.metrics
        if m.peak_flops_per_device is not None:
            return m.peak_flops_per_device, "configured (metrics.peak_flops_per_device)"
        if self.rank != 0:
            return None, "rank 0 only"
        if self.device == "cpu":
            return measure_cpu_matmul_flops(), "measured: fp32 matmul on this CPU"
        name = self.torch.cuda.get_device_name(self.ranks.local_rank)
        if m.gpu_model is not None:
            return lookup_peak_flops(m.gpu_model)[1], f"table: {m.gpu_model} (metrics.gpu_model)"  # type: ignore[index]
        found = lookup_peak_flops(name)
        if found is None:
            log.warning("no bf16 peak for %r: MFU is not reported (set metrics.peak_flops_per_device)", name)
            return None, f"unknown device {name}"
        return found[1], f"table: {found[0]} ({name})"

    def _write_run_json(self, peak: float | None, source: str, *, init_impl: str, bf16: bool) -> None:
        import deepspeed
        import torch
        import transformers

        cfg = self.cfg
        spec = cfg.model.spec
        device_name = torch.cuda.get_device_name(self.ranks.local_rank) if self.device == "cuda" else "cpu"
        run = {
            "job": cfg.name,
            "config": str(cfg.path),
            "host": socket.gethostname(),
            "world_size": self.world,
            "nodes": cfg.cluster.nodes,
            "gpus_per_node": cfg.cluster.gpus_per_node,
            "device": self.device,
            "device_name": device_name,
            "peak_flops_per_device": peak,
            "peak_flops_source": source,
            "model": spec.name,
            "params": spec.params,
            "init": init_impl,
            "dtype": "bf16" if bf16 else "fp32",
            "optimizer": optimizer_impl(cfg, self.settings, self.device),
            "seq_len": cfg.data.seq_len,
            "micro_batch": cfg.data.micro_batch,
            "grad_accum": cfg.data.grad_accum,
            "tokens_per_step": cfg.tokens_per_step,
            "flops_per_token": spec.flops_per_token(cfg.data.seq_len),
            "epochs": cfg.epochs,
            "equalize": cfg.data.equalize,
            "steps_per_epoch": self.steps_per_epoch,
            "tokens_per_epoch": self.tokens_per_epoch,
            "total_steps": self.schedule.total_steps,
            "plan_fingerprint": self.fingerprint,
            "started_unix_s": self.t_start,
            "versions": {
                "torch": torch.__version__,
                "deepspeed": deepspeed.__version__,
                "transformers": transformers.__version__,
            },
        }
        (self.metrics_dir / "run.json").write_text(json.dumps(run, indent=1) + "\n")

    # ------------------------------------------------------------------------------------- checkpoints
    def loop_state(self) -> dict[str, Any]:
        """What a checkpoint records about the loop (``trainer_state.json``): position, counters, leases."""
        return {
            "format": STATE_FORMAT,
            "job": self.cfg.name,
            "world_size": self.world,
            "step": self.step,
            "epoch": self.epoch,
            "micro_batch": self.micro_in_epoch,
            "tokens": self.tokens,
            "next_lr": self.schedule(self.step),
            "total_steps": self.schedule.total_steps,
            "elapsed_s": time.time() - self.t_start + self.elapsed_before_s,
            "save_bytes": self.save_bytes,
            "save_bytes_per_s": self.save_bytes_per_s,
            "epoch_end_s": self.epoch_end_s,
            "plan_fingerprint": self.fingerprint,
        }

    def _rank_state(self) -> dict[str, Any]:
        torch = self.torch
        state: dict[str, Any] = {
            "rank": self.rank,
            "rank_tokens": self.rank_tokens,
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.device == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state()
        return state

    def _resume(self, tag: str) -> None:
        state, rank_state = self.ckpt.load(tag)
        if state.get("format") != STATE_FORMAT:
            raise TrainError(
                f"{self.cfg.checkpoint.dir / tag}: unknown trainer state format {state.get('format')!r}"
            )
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.micro_in_epoch = int(state["micro_batch"])
        self.tokens = int(state["tokens"])
        self.elapsed_before_s = float(state.get("elapsed_s", 0.0))
        self.save_bytes = state.get("save_bytes")
        self.save_bytes_per_s = state.get("save_bytes_per_s")
        self.epoch_end_s = state.get("epoch_end_s")
        self.last_saved_step = self.step
        self.resumed_from = tag
        if state.get("plan_fingerprint") != self.fingerprint:
            log.warning(
                "resuming %s: the data plan changed since it was saved (fingerprint %s, now %s): the data "
                "position no longer means the same documents",
                tag,
                state.get("plan_fingerprint"),
                self.fingerprint,
            )
        if rank_state:
            self.rank_tokens = int(rank_state.get("rank_tokens", 0))
            random.setstate(rank_state["python_rng"])
            np.random.set_state(rank_state["numpy_rng"])
            self.torch.set_rng_state(rank_state["torch_rng"])
            if self.device == "cuda" and "cuda_rng" in rank_state:
                self.torch.cuda.set_rng_state(rank_state["cuda_rng"])
        log.info(
            "resumed from %s: step %d, epoch %d, micro-batch %d, next lr %.3g",
            tag,
            self.step,
            self.epoch,
            self.micro_in_epoch,
            self.schedule(self.step),
        )

    def _save(self) -> None:
        """Save under a ``checkpoint`` lease, then return to the phase we were in. A step already saved is
        not saved again (its checkpoint resumes to the same place)."""
        if self.last_saved_step == self.step:
            return
        p = self.settings.progress
        expected = self.save_bytes or checkpoint_bytes(
            self.cfg.model.spec.params, self.cfg.checkpoint.bytes_per_param, self.cfg.checkpoint.margin
        )
        bps = self.save_bytes_per_s or p.min_save_bytes_per_s
        lease = save_lease_s(
            expected,
            bps,
            factor=p.lease_factor,
            slack_s=p.lease_slack_s,
            min_s=p.min_lease_s,
            max_s=p.max_lease_s,
        )
        back_to = self.progress.current
        self._finish_log()
        self.progress.flush()
        self.progress.phase("checkpoint", lease_s=lease)
        res = self.ckpt.save(self.step, self.loop_state(), self._rank_state())
        self.save_bytes, self.save_bytes_per_s = float(res.bytes_total), res.bytes_per_s
        self.last_saved_step = self.step
        self.saves += 1
        self.metrics.write(
            "checkpoint",
            step=self.step,
            epoch=self.epoch,
            tag=res.tag,
            bytes=res.bytes_total,
            seconds=round(res.seconds, 4),
            bytes_per_s=res.bytes_per_s,
            lease_s=round(lease, 3),
            pruned=list(res.pruned),
        )
        log.info(
            "saved %s: %.1f MB in %.2f s (%.1f MB/s; lease was %.0f s)",
            res.tag,
            res.bytes_total / 1e6,
            res.seconds,
            res.bytes_per_s / 1e6,
            lease,
        )
        if back_to == "train":
            self.progress.phase("train")
        else:
            self.progress.phase(back_to, lease_s=self._epoch_end_lease())

    # ------------------------------------------------------------------------------------------- loop
    def _epoch_end_lease(self) -> float:
        p = self.settings.progress
        return duration_lease_s(
            self.epoch_end_s,
            p.epoch_end_lease_s,
            factor=p.lease_factor,
            slack_s=p.lease_slack_s,
            min_s=p.min_lease_s,
            max_s=p.max_lease_s,
        )

    def micro_batch_count(self, epoch: int) -> int:
        """How many micro-batches this rank runs in ``epoch``: equalized (a collective) or, with equalize
        off, its own plan count rounded to whole steps."""
        from ft_trainer.planning.equalize import equalize_epoch

        cfg = self.cfg
        plan = self.data.epoch_plan(epoch)
        if cfg.data.equalize:
            eq = equalize_epoch(
                int(plan.local_micro_batches[self.rank]),
                grad_accum=cfg.data.grad_accum,
                micro_batch=cfg.data.micro_batch,
                seq_len=cfg.data.seq_len,
                epoch=epoch,
                expected=int(plan.micro_batches[self.rank]),
                logger=log,
            )
            self.metrics.write(
                "equalize",
                epoch=epoch,
                micro_batches=eq.micro_batches,
                min=eq.min_micro_batches,
                max=eq.max_micro_batches,
                rank0_dropped_tokens=eq.dropped_tokens,
            )
            return eq.micro_batches
        count = int(plan.micro_batches[self.rank])
        if not plan.balanced:
            log.error(
                "equalize is OFF and epoch %d is unbalanced: ranks run %s micro-batches - the ranks with "
                "fewer will wait at the end of the epoch for a collective the others never join (deadlock)",
                epoch,
                plan.micro_batches.tolist(),
            )
        return count

    def train_micro_batches(self, batches: Iterable[np.ndarray]) -> None:
        """Forward, backward and ``engine.step`` for each micro-batch, with the per-step bookkeeping
        (learning rate, progress, metrics, periodic saves). Stops early at ``train.max_steps``."""
        torch, engine = self.torch, self.engine
        device = engine.device
        for mb in batches:
            if self._micro_in_step == 0:
                lr = self.schedule(self.step)
                for group in engine.optimizer.param_groups:
                    group["lr"] = lr
            x = torch.from_numpy(mb).to(device, non_blocking=True)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            self._loss_sum += loss.detach()
            self._loss_n += 1
            self.micro_in_epoch += 1
            self.rank_tokens += int(mb.size)
            self._micro_in_step += 1
            if self._micro_in_step == self.cfg.data.grad_accum:
                self._micro_in_step = 0
                self._after_optimizer_step()
                if self._stop:
                    return

    def _after_optimizer_step(self) -> None:
        s = self.settings
        self.step += 1
        self.tokens += self.cfg.tokens_per_step
        self.progress.step(self.step, self.epoch, self.rank_tokens)
        self.meter.add_step()
        if self.step % s.metrics.log_every_steps == 0:
            self._log_interval()
        if s.train.save_every_steps and self.step % s.train.save_every_steps == 0:
            self._save()
        if s.train.max_steps and self.step >= s.train.max_steps:
            self._stop = True

    def _log_interval(self) -> None:
        """Start the all-reduce of the interval's loss without waiting for it (it completes during the next
        step's compute); the step record is written when it is done - at the next interval, or before an
        epoch end, a save or the end of the run (:meth:`_finish_log`)."""
        torch = self.torch
        self._finish_log()
        t = torch.stack(
            [
                self._loss_sum,
                torch.tensor(float(self._loss_n), dtype=torch.float64, device=self._loss_sum.device),
            ]
        )
        work = self.dist.all_reduce(t, async_op=True)
        self._loss_sum.zero_()
        self._loss_n = 0
        facts: dict[str, Any] = {"step": self.step, "epoch": self.epoch, "tokens": self.tokens}
        if self.rank == 0:
            grad_norm = self.engine.get_global_grad_norm()
            if grad_norm is not None and hasattr(grad_norm, "item"):
                grad_norm = grad_norm.item()
            facts["lr"] = self.schedule(self.step - 1)
            facts["grad_norm"] = None if grad_norm is None else float(grad_norm)
            facts["numbers"] = self.meter.close_interval(time.time())
        else:
            self.meter.start_interval(time.time())
        self._pending_log = (work, t, facts)

    def _finish_log(self) -> None:
        """Wait for the pending loss all-reduce and write its step record (rank 0)."""
        if self._pending_log is None:
            return
        work, t, facts = self._pending_log
        self._pending_log = None
        work.wait()
        total, n = float(t[0].item()), float(t[1].item())
        loss = total / max(1.0, n)
        self._epoch_loss_sum += total
        self._epoch_loss_n += int(n)
        self.last_loss = loss
        if self.rank != 0:
            return
        nums = facts.pop("numbers")
        self.metrics.write(
            "step",
            step=facts["step"],
            epoch=facts["epoch"],
            loss=loss,
            lr=facts["lr"],
            grad_norm=facts["grad_norm"],
            tokens=facts["tokens"],
            **{k: (None if v is None else round(v, 6)) for k, v in nums.items()},
        )
        mfu = nums.get("mfu")
        log.info(
            "step %d/%d epoch %d loss %.4f lr %.3g %.0f tokens/s %s",
            facts["step"],
            self.schedule.total_steps,
            facts["epoch"],
            loss,
            facts["lr"],
            nums["tokens_per_s"],
            "" if mfu is None else f"MFU {100 * mfu:.2f}%",
        )

    def _end_epoch(self, epoch: int, count: int) -> int | None:
        """Epoch bookkeeping under an ``epoch_end`` lease: statistics (a collective - where a rank with
        fewer micro-batches waits forever when equalize is off), the epoch's checkpoint, and the next
        epoch's equalize. Returns the next epoch's count (None after the last epoch)."""
        t0 = time.perf_counter()
        self.progress.flush()
        self.progress.phase("epoch_end", lease_s=self._epoch_end_lease())
        # Every rank has finished its micro-batches: the first collective of the epoch end. With equalize
        # off, a rank with fewer micro-batches waits here while another waits in its next forward/backward
        # collective - the epoch-end deadlock (on NCCL and gloo alike: neither side ever completes).
        self.dist.barrier()
        self._finish_log()
        torch = self.torch
        stats = torch.tensor(
            [float(self._epoch_loss_sum), float(self._epoch_loss_n)],
            dtype=torch.float64,
            device=self._loss_sum.device,
        )
        self.dist.all_reduce(stats)
        epoch_wall_s = time.time() - self._epoch_t0
        self.metrics.write(
            "epoch",
            epoch=epoch,
            micro_batches=count,
            steps=count // self.cfg.data.grad_accum,
            step=self.step,
            loss=float(stats[0].item() / max(1.0, stats[1].item())),
            seconds=round(epoch_wall_s, 3),
        )
        self._epoch_loss_sum, self._epoch_loss_n = 0.0, 0
        self.epoch, self.micro_in_epoch = epoch + 1, 0
        save_s = 0.0
        if self.settings.train.save_every_epoch:
            ts = time.perf_counter()
            self._save()
            save_s = time.perf_counter() - ts
        nxt = self.micro_batch_count(epoch + 1) if epoch + 1 < self.cfg.epochs else None
        self.epoch_end_s = time.perf_counter() - t0 - save_s
        return nxt

    def run(self) -> TrainResult:
        cfg, s = self.cfg, self.settings
        epoch = self.epoch
        count = self.micro_batch_count(epoch) if epoch < cfg.epochs else 0
        self.meter.start_interval(time.time())
        while epoch < cfg.epochs and not self._stop:
            plan = self.data.epoch_plan(epoch)
            stream = self.data.rank_stream(plan, self.rank)
            self._epoch_t0 = time.time()
            self.progress.phase("train")
            if self.micro_in_epoch < count:
                self.train_micro_batches(stream.iter_micro_batches(count, start=self.micro_in_epoch))
            if self._stop and self.micro_in_epoch < count:
                break
            nxt = self._end_epoch(epoch, count)
            epoch += 1
            count = nxt or 0
        self._finish_log()
        if s.train.save_at_end and self.last_saved_step != self.step:
            self._save()
        self.progress.phase("done", lease_s=s.progress.done_lease_s)
        self.metrics.write(
            "done",
            step=self.step,
            epoch=self.epoch,
            tokens=self.tokens,
            loss=self.last_loss,
            gpu_hours=self.meter.elapsed_s(time.time()) * self.world / 3600.0,
            stopped_at_max_steps=self._stop,
        )
        return TrainResult(
            steps=self.step,
            epoch=self.epoch,
            tokens=self.tokens,
            last_loss=self.last_loss,
            stopped_at_max_steps=self._stop,
            saves=self.saves,
        )

    def close(self) -> None:
        self.metrics.close()
        self.progress.close()
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:  # teardown must not mask the run's outcome
            log.debug("destroy_process_group: %s", exc)
