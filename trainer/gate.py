"""``ft-trainer gate``: the pre-launch invariant gate. Imports neither torch nor DeepSpeed (a test pins
this), so it runs on a login node in well under a second for a billion-token corpus on 16 ranks.

Each invariant is a function returning ``(ok, detail)``; a failing detail says what is wrong, with the
numbers, and how to fix it. The plan is computed by :func:`ft_trainer.planning.plan.build_epoch_plan`
from the cache's document index with :meth:`ft_trainer.config.JobConfig.packing_params` - the
very calls ``JobData`` makes at training time, so the gate judges the plan that will run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ft_trainer.config import JobConfig
from ft_trainer.data.cache import CacheError, CacheIndex, check_cache
from ft_trainer.planning.cluster import HostfileError, check_cluster, load_hosts
from ft_trainer.planning.estimates import GIB, checkpoint_bytes, zero3_memory
from ft_trainer.planning.plan import EpochPlan, build_epoch_plan, plan_fingerprint

__all__ = ["GateReport", "Invariant", "equal_steps_verdict", "run_gate"]

Check = tuple[bool, str]


SKIPPED = "skipped: "
"""The detail of a check that could not run because one it depends on failed (``cache_integrity``):
shown as SKIP, counted apart from the failures - it is not known to fail, only not yet checked."""


@dataclass(frozen=True)
class Invariant:
    name: str
    ok: bool
    detail: str
    seconds: float
    skipped: bool = False
    """Not evaluated: an invariant it depends on failed (``ok`` is False: the gate cannot pass)."""


@dataclass
class GateReport:
    config: str
    ok: bool
    seconds: float
    invariants: list[Invariant]
    fingerprint: str | None = None
    deep: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 6),
            "invariants": [asdict(i) | {"seconds": round(i.seconds, 6)} for i in self.invariants],
            "config": self.config,
            "plan_fingerprint": self.fingerprint,
            "deep": self.deep,
        }

    def failed(self) -> list[Invariant]:
        """The invariants that were checked and do not hold (skipped ones are not among them)."""
        return [i for i in self.invariants if not i.ok and not i.skipped]

    def skipped(self) -> list[Invariant]:
        return [i for i in self.invariants if i.skipped]

    def render(self) -> str:
        width = max((len(i.name) for i in self.invariants), default=10)
        lines = [f"ft-trainer gate: {self.config}" + (" (--deep)" if self.deep else "")]
        for i in self.invariants:
            mark = "SKIP" if i.skipped else ("PASS" if i.ok else "FAIL")
            lines.append(f"{mark}  {i.name:<{width}}  {i.seconds:7.3f} s  {i.detail}")
        bad, skipped = self.failed(), self.skipped()
        verdict = "PASS"
        if not self.ok:
            verdict = f"FAIL ({len(bad)} of {len(self.invariants)} invariants failed"
            if skipped:
                verdict += f", {len(skipped)} not checked until those pass"
            verdict += ")"
        fp = f", plan {self.fingerprint}" if self.fingerprint else ""
        lines.append(f"gate: {verdict} in {self.seconds:.3f} s{fp}")
        return "\n".join(lines)


def _n(x: float) -> str:
    return f"{int(x):,}"


def _gib(b: float) -> str:
    """Bytes in GiB, or in MiB/KiB when under one GiB (so a tiny model's numbers are not all 0.0)."""
    if b >= GIB or b == 0:
        return f"{b / GIB:,.1f} GiB"
    if b >= 1 << 20:
        return f"{b / (1 << 20):,.1f} MiB"
    return f"{b / 1024:,.1f} KiB"


def _ranks(ranks: np.ndarray) -> str:
    r = [int(x) for x in ranks]
    shown = ", ".join(map(str, r[:8])) + (f" (+{len(r) - 8} more)" if len(r) > 8 else "")
    return ("rank " if len(r) == 1 else "ranks ") + shown


# ------------------------------------------------------------------------------------------- pure checks
def batch_arithmetic(
    micro_batch: int, grad_accum: int, world_size: int, seq_len: int, global_batch: int | None
) -> Check:
    got = micro_batch * grad_accum * world_size
    if global_batch is not None and global_batch != got:
        hint = ""
        if global_batch % (micro_batch * world_size) == 0:
            hint = f"set data.grad_accum = {global_batch // (micro_batch * world_size)} or "
        return False, (
            f"micro_batch {micro_batch} x grad_accum {grad_accum} x world_size {world_size} = {got}, "
            f"but data.global_batch = {global_batch}: {hint}set data.global_batch = {got}"
        )
    return True, (
        f"micro_batch {micro_batch} x grad_accum {grad_accum} x world_size {world_size} = {got} sequences "
        f"= {_n(got * seq_len)} tokens per optimizer step"
    )


def seq_len_within_positions(seq_len: int, max_positions: int, model: str) -> Check:
    if seq_len > max_positions:
        return False, (
            f"data.seq_len {_n(seq_len)} > {model}'s max positions {_n(max_positions)}: lower seq_len "
            "(or extend the model's context, e.g. RoPE scaling, and set model.max_positions)"
        )
    return True, f"seq_len {_n(seq_len)} <= {model}'s max positions {_n(max_positions)}"


def token_ids_within_vocab(max_token_id: int, vocab_size: int, dtype: str, tok: dict[str, Any]) -> Check:
    if max_token_id >= vocab_size:
        return False, (
            f"largest token id in the cache is {_n(max_token_id)} >= model vocabulary {_n(vocab_size)}: "
            f"the cache was tokenized with a tokenizer of {_n(tok.get('vocab_size', 0))} tokens "
            f"({tok.get('file')}); the embedding lookup would fail. Re-tokenize with the model's "
            "tokenizer, or fix model.vocab_size"
        )
    limit = np.iinfo(np.dtype(dtype)).max
    if max_token_id > limit:
        return False, f"largest token id {_n(max_token_id)} does not fit the cache dtype {dtype}"
    return True, f"largest token id {_n(max_token_id)} < vocabulary {_n(vocab_size)} (cache dtype {dtype})"


def equal_steps_verdict(plans: list[EpochPlan]) -> Check:
    """Every rank runs the same number of micro-batches in every epoch, and at least one optimizer step."""
    problems: list[str] = []
    unequal: list[str] = []
    for p in plans:
        mb = p.micro_batches
        lo, hi = int(mb.min()), int(mb.max())
        if lo != hi:
            if unequal:
                unequal.append(f"epoch {p.epoch} ({lo}..{hi})")
                continue
            fewest, most = np.flatnonzero(mb == lo), np.flatnonzero(mb == hi)
            verb_lo = "gets" if len(fewest) == 1 else "get"
            verb_hi = "gets" if len(most) == 1 else "get"
            if np.unique(mb).size == 2:
                drop = hi - lo
                fix = (
                    f"drop {drop} batch{'es' if drop != 1 else ''} from the longer "
                    f"rank{'s' if len(most) != 1 else ''}"
                )
            else:
                fix = f"drop {int((mb - lo).sum())} batches in all so that every rank runs {lo}"
            unequal.append(
                f"epoch {p.epoch}: {_ranks(fewest)} {verb_lo} {lo} micro-batches, "
                f"{_ranks(most)} {verb_hi} {hi} (over {p.world_size} ranks; the longer ranks would wait "
                "forever in a collective at epoch end): "
                f"enable equalize (data.equalize = true) or {fix}"
            )
        elif int(p.steps.min()) == 0:
            ga = p.params.grad_accum
            problems.append(
                f"epoch {p.epoch}: 0 optimizer steps per rank (the smallest rank packs "
                f"{int(p.local_micro_batches.min())} micro-batches, grad_accum is {ga}): the corpus is too "
                "small "
                "for this world size x micro_batch x grad_accum x seq_len; add data or shrink one of them"
            )
    if len(unequal) > 1:
        unequal = [unequal[0] + "; also unequal: " + ", ".join(unequal[1:])]
    problems = unequal + problems
    if problems:
        return False, "; ".join(problems)
    params = plans[0].params
    steps = sorted({int(p.steps[0]) for p in plans})
    mbs = sorted({int(p.micro_batches[0]) for p in plans})
    total_tokens = sum(int(p.rank_tokens.sum()) for p in plans)
    dropped = sum(int(p.dropped_tokens.sum()) for p in plans)
    eq_dropped = sum(int(p.equalize_dropped_tokens.sum()) for p in plans)
    mode = "equalize on" if params.equalize else "equalize OFF (counts happen to be equal)"
    per = (
        f"{mbs[0]} micro-batches = {steps[0]} steps"
        if len(steps) == 1 and len(mbs) == 1
        else f"{mbs[0]}..{mbs[-1]} micro-batches = {steps[0]}..{steps[-1]} steps"
    )
    pct = 100.0 * dropped / total_tokens if total_tokens else 0.0
    return True, (
        f"{len(plans)} epoch(s) x {params.world_size} ranks: every rank runs {per} per epoch ({mode}); "
        f"dropped {_n(dropped)} of {_n(total_tokens)} tokens ({pct:.2f} %, {_n(eq_dropped)} by "
        "equalize/step rounding, the rest packing tails)"
    )


def memory_verdict(
    per_gpu_bytes: int,
    states_bytes: int,
    act_bytes: int,
    cpu_node_bytes: int,
    gpu_capacity_gib: float | None,
    cpu_capacity_gib: float | None,
    usable: float = 0.9,
) -> Check:
    detail = (
        f"per GPU {_gib(per_gpu_bytes)} (model states {_gib(states_bytes)} + activations {_gib(act_bytes)})"
        f"{f' of {gpu_capacity_gib:g} GiB' if gpu_capacity_gib else ''}; per node CPU {_gib(cpu_node_bytes)}"
        f"{f' of {cpu_capacity_gib:g} GiB' if cpu_capacity_gib else ''}"
    )
    problems = []
    if gpu_capacity_gib and per_gpu_bytes > usable * gpu_capacity_gib * GIB:
        problems.append(
            f"GPU estimate exceeds {usable:.0%} of {gpu_capacity_gib:g} GiB: offload the optimizer "
            "(zero.offload_optimizer = 'cpu'), lower micro_batch/seq_len, or add GPUs"
        )
    if cpu_capacity_gib and cpu_node_bytes > usable * cpu_capacity_gib * GIB:
        problems.append(
            f"CPU estimate exceeds {usable:.0%} of {cpu_capacity_gib:g} GiB per node: offload less or "
            "add nodes"
        )
    if problems:
        return False, detail + ": " + "; ".join(problems)
    if not gpu_capacity_gib and not cpu_capacity_gib:
        detail += " (set cluster.gpu_memory_gib / cpu_memory_gib to check against capacity)"
    return True, detail


# ---------------------------------------------------------------------------------------------- I/O checks
def checkpoint_dir_check(
    path: Path, need_bytes: int, params: int, bytes_per_param: float, margin: float, keep_last: int
) -> Check:
    path = Path(path)
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return False, (
            f"checkpoint.dir {path} cannot be created: {probe} exists and is not a directory; "
            "point checkpoint.dir elsewhere"
        )
    if probe == path:
        try:
            fd, tmp = tempfile.mkstemp(dir=path, prefix=".gate-write-test-")
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            return False, (
                f"checkpoint.dir {path} is not writable ({exc.strerror}): fix its permissions or owner, "
                "or point checkpoint.dir elsewhere"
            )
        where = f"{path} writable"
    else:
        if not os.access(probe, os.W_OK | os.X_OK):
            return False, (
                f"checkpoint.dir {path} does not exist and {probe} is not writable: create it with the "
                "right owner, or point checkpoint.dir elsewhere"
            )
        where = f"{path} can be created in {probe}"
    free = shutil.disk_usage(probe).free
    need_txt = (
        f"a full ZeRO-3 checkpoint needs {_gib(need_bytes)} ({_n(params)} params x {bytes_per_param:g} B "
        f"x {1 + margin:.2f})"
    )
    if free < need_bytes:
        return False, (
            f"only {_gib(free)} free on {probe}, {need_txt}: free space or move checkpoint.dir "
            "(keep_last old checkpoints stay until the new one is complete)"
        )
    return True, (
        f"{where}; {_gib(free)} free, {need_txt}; keep_last {keep_last} uses about "
        f"{_gib(need_bytes * (keep_last + 1))} at peak"
    )


def stream_source_check(root: Path, shards: list[dict[str, Any]]) -> Check:
    if not Path(root).is_dir():
        return False, f"data.source_dir {root} is not a directory (is the network file system mounted?)"
    sizes: dict[str, int] = {}
    for s in shards:
        sizes.setdefault(s["source"], int(s["unit"]["source_bytes"]))
    missing, changed = [], []
    for rel, size in sizes.items():
        try:
            st = os.stat(Path(root) / rel)
        except OSError:
            missing.append(rel)
            continue
        if st.st_size != size:
            changed.append(f"{rel} ({st.st_size} bytes, index says {size})")
    if missing or changed:
        parts = []
        if missing:
            parts.append(f"{len(missing)} source file(s) missing, e.g. {missing[0]}")
        if changed:
            parts.append(f"{len(changed)} changed size, e.g. {changed[0]}")
        return False, f"under {root}: " + "; ".join(
            parts
        ) + ": rebuild the index with pretokenize --index-only"
    return True, f"{len(sizes)} source file(s) under {root} present with the indexed sizes"


# ------------------------------------------------------------------------------------------------ runner
def _cluster_check(cfg: JobConfig) -> Check:
    """World size, nodes, GPUs per node, launcher and hostfile agree."""
    c = cfg.cluster
    hosts = load_hosts(c.hostfile)
    problems = check_cluster(
        world_size=c.world_size,
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        launcher=c.launcher,
        hosts=hosts,
        hostfile_name=str(c.hostfile or "hostfile"),
    )
    if problems:
        return False, "; ".join(problems)
    hf = f", hostfile {c.hostfile} ({len(hosts)} hosts)" if hosts is not None else ""
    return True, (
        f"world_size {c.world_size} = {c.nodes} node(s) x {c.gpus_per_node} GPUs, launcher {c.launcher}{hf}"
    )


def _tokenizer_check(cfg: JobConfig, index: CacheIndex | None) -> Check:
    """The configured tokenizer is the one the cache was built with."""
    d = cfg.data
    if index is None:
        return False, SKIPPED + "no readable cache manifest (see cache_integrity)"
    want = index.manifest["tokenizer"]
    if cfg.model.tokenizer is None:
        if d.mode == "stream":
            return False, "stream mode tokenizes at run time: set model.tokenizer (the index's tokenizer)"
        return True, f"model.tokenizer not set; cache built with {want['file']} ({want['sha256'][:12]})"
    from ft_trainer.data.tokenization import tokenizer_sha256

    sha = tokenizer_sha256(cfg.model.tokenizer)
    if sha != want["sha256"]:
        return False, (
            f"model.tokenizer {cfg.model.tokenizer} has SHA-256 {sha[:12]}, the cache was built with "
            f"{want['file']} ({want['sha256'][:12]}): re-tokenize, or point model.tokenizer at the "
            "cache's tokenizer"
        )
    return True, f"{cfg.model.tokenizer} matches the cache's tokenizer ({sha[:12]})"


def _memory_check(cfg: JobConfig) -> Check:
    """The ZeRO-3 memory estimate fits the GPUs and the nodes' memory."""
    c, d, spec = cfg.cluster, cfg.data, cfg.model.spec
    z = cfg.zero
    est = zero3_memory(
        spec,
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        seq_len=d.seq_len,
        micro_batch=d.micro_batch,
        offload_optimizer=z.offload_optimizer != "none",
        offload_param=z.offload_param != "none",
        zero_init=z.zero_init,
        buffer_factor=z.buffer_factor,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )
    return memory_verdict(
        est.per_gpu_bytes,
        est.model_states_per_gpu_bytes,
        est.activations_per_gpu_bytes,
        est.cpu_per_node_bytes,
        c.gpu_memory_gib,
        c.cpu_memory_gib,
    )


def run_gate(cfg: JobConfig, *, deep: bool = False) -> GateReport:
    """Evaluate every invariant for ``cfg``. Never raises for a failing job: failures are invariants."""
    t_start = time.perf_counter()
    invariants: list[Invariant] = []
    state: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Check]) -> None:
        t0 = time.perf_counter()
        try:
            ok, detail = fn()
        except (OSError, ValueError, KeyError, CacheError, HostfileError) as exc:
            named = isinstance(exc, CacheError | HostfileError)  # their messages already say what and where
            ok, detail = False, str(exc) if named else f"{type(exc).__name__}: {exc}"
        skipped = not ok and detail.startswith(SKIPPED)
        invariants.append(Invariant(name, ok, detail, time.perf_counter() - t0, skipped=skipped))

    d, c, spec = cfg.data, cfg.cluster, cfg.model.spec
    model_name = cfg.model.preset or str(cfg.model.path)

    run(
        "batch_arithmetic",
        lambda: batch_arithmetic(d.micro_batch, d.grad_accum, c.world_size, d.seq_len, d.global_batch),
    )

    run("cluster_agreement", lambda: _cluster_check(cfg))
    run(
        "seq_len_within_positions",
        lambda: seq_len_within_positions(d.seq_len, spec.max_positions, model_name),
    )

    def cache() -> Check:
        idx = check_cache(d.cache_dir, deep=deep)
        state["index"] = idx
        m = idx.manifest
        if idx.problems:
            more = f" (+{len(idx.problems) - 3} more)" if len(idx.problems) > 3 else ""
            return False, "; ".join(idx.problems[:3]) + more
        if d.mode == "cache" and not idx.has_tokens:
            return False, (
                f"{d.cache_dir} is index-only (pretokenize --index-only) but data.mode = 'cache': "
                "set data.mode = 'stream' or rebuild without --index-only"
            )
        nfiles = sum(len(s["files"]) for s in m["shards"])
        how = "full SHA-256" if deep else "sizes, headers, sampled checksums"
        return True, (
            f"{len(m['shards'])} shard(s), {_n(m['num_docs'])} documents, {_n(m['num_tokens'])} tokens "
            f"({m['dtype']}{', index only' if not idx.has_tokens else ''}); {nfiles} files: {how} OK"
        )

    run("cache_integrity", cache)
    index: CacheIndex | None = state.get("index")

    run("tokenizer_matches_cache", lambda: _tokenizer_check(cfg, index))

    def vocab() -> Check:
        if index is None:
            return False, SKIPPED + "no readable cache manifest (see cache_integrity)"
        m = index.manifest
        return token_ids_within_vocab(int(m["max_token_id"]), spec.vocab_size, m["dtype"], m["tokenizer"])

    run("token_ids_within_vocab", vocab)

    if d.mode == "stream":

        def stream() -> Check:
            if index is None:
                return False, SKIPPED + "no readable cache manifest (see cache_integrity)"
            return stream_source_check(d.source_dir or Path(index.manifest["source"]["root"]), index.shards)

        run("stream_source", stream)

    def steps() -> Check:
        if index is None or index.problems:
            return (
                False,
                SKIPPED + "the cache is not sound (see cache_integrity), so the plan cannot be trusted",
            )
        params = cfg.packing_params()
        plans = [build_epoch_plan(index.doc_lengths, params, e) for e in range(cfg.epochs)]
        state["fingerprint"] = plan_fingerprint(plans)
        return equal_steps_verdict(plans)

    run("equal_steps_per_rank", steps)

    k = cfg.checkpoint
    need = checkpoint_bytes(spec.params, k.bytes_per_param, k.margin)
    run(
        "checkpoint_dir",
        lambda: checkpoint_dir_check(k.dir, need, spec.params, k.bytes_per_param, k.margin, k.keep_last),
    )

    run("zero3_memory", lambda: _memory_check(cfg))

    return GateReport(
        config=str(cfg.path),
        ok=all(i.ok for i in invariants),
        seconds=time.perf_counter() - t_start,
        invariants=invariants,
        fingerprint=state.get("fingerprint"),
        deep=deep,
    )


def config_error_report(path: str, message: str, seconds: float) -> GateReport:
    """The report of a job file that does not load: one failing ``config`` invariant."""
    return GateReport(
        config=path, ok=False, seconds=seconds, invariants=[Invariant("config", False, message, seconds)]
    )


def dump_json(report: GateReport) -> str:
    return json.dumps(report.to_json(), indent=1)
