"""The job file: one TOML that ``pretokenize``, ``gate``, ``bench-data`` and ``train`` all read.

Every key is documented in ``docs/trainer.md``. Each section is a frozen dataclass below whose fields are
the section's keys, each default written once on its field (with its bounds);
:mod:`gpu_triage.model.config_schema` reads the file into them. Loading checks types and ranges and
rejects unknown keys (a typo would otherwise silently fall back to a default), and reports EVERY
problem at once: one :class:`ConfigError` lists them, each with the file, the line, the key, what was
expected and what was found. Relative paths are resolved against the job file's directory. Sections
reserved for ``ft-trainer train`` (``[train]``, ``[optim]``, ``[deepspeed]``, ``[progress]``,
``[metrics]``) are kept as raw tables in :attr:`JobConfig.extra` for that command to read
(:mod:`ft_trainer.train.settings`, the same way). No torch here.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ft_trainer.planning.presets import PRESETS, ModelSpec, from_hf_config
from gpu_triage.model.config_schema import (
    MISSING,
    Problem,
    Reader,
    SchemaError,
    derived,
    setting,
    show,
    toml_syntax_problem,
)

if TYPE_CHECKING:
    from ft_trainer.planning.plan import PackingParams

__all__ = [
    "RESERVED_SECTIONS",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "JobConfig",
    "JobSection",
    "ModelConfig",
    "ZeroConfig",
    "load_config",
    "parse_config",
]

RESERVED_SECTIONS = ("train", "optim", "deepspeed", "progress", "metrics")
MAX_JOB_FILE_BYTES = 1 << 20  # a job file is a few KiB


class ConfigError(SchemaError):
    """A job file's problems, each ``file:line: key: expected ..., got ...``; ``str()`` lists them one a
    line (``.problems`` has them as values). ``ConfigError(file, key, expected, actual)`` is one problem;
    ``message`` replaces the "expected ..., got ..." text."""

    def __init__(
        self,
        file: str | Path,
        key: str,
        expected: str = "",
        actual: Any = MISSING,
        *,
        message: str = "",
        line: int | None = None,
    ) -> None:
        text = message or f"expected {expected}, got {show(actual)}"
        super().__init__([Problem(str(file), line, key, text)])

    @classmethod
    def of(cls, problems: Sequence[Problem]) -> ConfigError:
        """One error listing ``problems`` (what :meth:`Reader.raise_if_any` calls)."""
        error = cls.__new__(cls)
        SchemaError.__init__(error, problems)
        return error


# ------------------------------------------------------------------------------------------- sections
@dataclass(frozen=True, kw_only=True)
class JobSection:
    """``[job]``."""

    name: str | None = setting(None, nonempty=True, doc="default: the job file's name without .toml")
    seed: int = setting(0, ge=0)
    epochs: int = setting(1, ge=1)
    expected_tokens_per_s: float | None = setting(None, gt=0, expected="a number > 0 (tokens/s)")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """``[model]``: exactly one of ``preset`` and ``path``; :attr:`spec` is the architecture they name."""

    preset: str | None = setting(None, choices=sorted(PRESETS))
    path: Path | None = setting(None, doc="a local Hugging Face model directory (config.json)")
    tokenizer: Path | None = setting(None, doc="default: model.path")
    vocab_size: int | None = setting(None, ge=1)
    max_positions: int | None = setting(None, ge=1)
    params: int | None = setting(None, ge=1)
    gradient_checkpointing: bool = True
    spec: ModelSpec = derived(doc="the preset's or the directory's architecture, with the overrides")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """``[data]``."""

    mode: Literal["cache", "stream"] = "cache"
    cache_dir: Path = setting()
    source_dir: Path | None = setting(None, doc="the corpus (required when mode = 'stream')")
    seq_len: int = setting(ge=2)
    micro_batch: int = setting(1, ge=1)
    grad_accum: int = setting(1, ge=1)
    global_batch: int | None = setting(None, ge=1)
    equalize: bool = True
    text_field: str = setting("text", nonempty=True, expected="a column/field name")
    text_unit: Literal["line", "file"] = "line"
    eos_token: str = "<|endoftext|>"
    workers: int = setting(0, ge=0, expected="an integer >= 0 (0 = auto)")
    shard_mb: int = setting(128, ge=1, expected="an integer >= 1 (MiB)")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """``[cluster]``; ``world_size`` is ``nodes x gpus_per_node`` unless the file sets it."""

    nodes: int = setting(1, ge=1)
    gpus_per_node: int = setting(1, ge=1)
    world_size: int = setting(0, ge=1, expected="an integer >= 1 (absent: nodes x gpus_per_node)")
    launcher: Literal["deepspeed", "torchrun", "local"] = "deepspeed"
    hostfile: Path | None = None
    gpu_memory_gib: float | None = setting(None, gt=0, expected="a number > 0 (GiB)")
    cpu_memory_gib: float | None = setting(None, gt=0, expected="a number > 0 (GiB)")
    world_size_explicit: bool = derived(False, doc="the file set world_size")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """``[checkpoint]``."""

    dir: Path = setting()
    keep_last: int = setting(2, ge=1)
    bytes_per_param: float = setting(16.0, gt=0)
    margin: float = setting(0.10, ge=0, le=10, expected="a fraction 0..10")


@dataclass(frozen=True, kw_only=True)
class ZeroConfig:
    """``[zero]``."""

    stage: Literal[3] = setting(3, expected="3 (this trainer runs ZeRO stage 3)")
    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    offload_param: Literal["none", "cpu", "nvme"] = "none"
    zero_init: bool = True
    buffer_factor: float = setting(1.5, ge=1)


SECTIONS: dict[str, type] = {
    "job": JobSection,
    "model": ModelConfig,
    "data": DataConfig,
    "cluster": ClusterConfig,
    "checkpoint": CheckpointConfig,
    "zero": ZeroConfig,
}


@dataclass(frozen=True)
class JobConfig:
    path: Path
    name: str
    seed: int
    epochs: int
    expected_tokens_per_s: float | None
    model: ModelConfig
    data: DataConfig
    cluster: ClusterConfig
    checkpoint: CheckpointConfig
    zero: ZeroConfig
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    text: str = field(default="", repr=False, compare=False)  # the file, for the lines of later problems

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro_batch x grad_accum x world_size."""
        return self.data.micro_batch * self.data.grad_accum * self.cluster.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.data.seq_len

    def packing_params(self) -> PackingParams:
        """The plan's parameters training and the gate both use (one place, so they cannot drift)."""
        from ft_trainer.planning.plan import PackingParams  # numpy: only when a plan is wanted

        return PackingParams(
            seq_len=self.data.seq_len,
            micro_batch=self.data.micro_batch,
            grad_accum=self.data.grad_accum,
            world_size=self.cluster.world_size,
            seed=self.seed,
            equalize=self.data.equalize,
        )

    def reader(self) -> Reader:
        """A :class:`Reader` for more of this file (the reserved sections), lines and paths as here."""
        return Reader(self.path, self.text)


# ----------------------------------------------------------------------------------------------- loading
def load_config(path: str | Path) -> JobConfig:
    """Read and validate a job file. Raises :class:`ConfigError` listing every problem."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw_bytes = f.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(p, "", message=f"cannot read job file: {exc}") from None
    if len(raw_bytes) > MAX_JOB_FILE_BYTES:
        raise ConfigError(p, "", message=f"not a job file: larger than {MAX_JOB_FILE_BYTES} bytes")
    try:
        text = raw_bytes.decode("utf-8")
        doc = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(p, "", message=f"not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:  # file:line:, as every other problem (issue 28)
        raise ConfigError.of([toml_syntax_problem(str(p), exc, "TOML syntax error")]) from None
    return parse_config(doc, p, text)


def parse_config(doc: dict[str, Any], path: Path, text: str = "") -> JobConfig:
    """Validate an already-parsed TOML document (``path`` names it in errors and anchors relative paths;
    ``text``, its source, gives the lines)."""
    reader = Reader(path, text)
    known = [*SECTIONS, *RESERVED_SECTIONS]
    for name in doc:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            reader.problem(
                f"[{name}]",
                f"unknown section{hint}; known: " + ", ".join(sorted(known)),
                line=reader.lines.line(name),
            )
    job = reader.read(JobSection, doc.get("job", {}), "job")
    model = _model(reader, doc.get("model", {}))
    data = reader.read(DataConfig, doc.get("data", {}), "data")
    if data is not None and data.mode == "stream" and data.source_dir is None:
        reader.expected(
            "data.source_dir", "the corpus directory (required when data.mode = 'stream')", MISSING
        )
    cluster = reader.read(ClusterConfig, doc.get("cluster", {}), "cluster")
    if cluster is not None:
        if cluster.world_size:
            cluster = replace(cluster, world_size_explicit=True)
        else:
            cluster = replace(cluster, world_size=cluster.nodes * cluster.gpus_per_node)
    checkpoint = reader.read(CheckpointConfig, doc.get("checkpoint", {}), "checkpoint")
    zero = reader.read(ZeroConfig, doc.get("zero", {}), "zero")
    extra: dict[str, dict[str, Any]] = {}
    for name in RESERVED_SECTIONS:
        if name in doc:
            if isinstance(doc[name], dict):
                extra[name] = dict(doc[name])
            else:
                reader.expected(name, f"a table ([{name}])", doc[name])
    reader.raise_if_any(ConfigError.of)
    assert job and model and data and cluster and checkpoint and zero  # else raise_if_any raised
    return JobConfig(
        path=path,
        name=job.name or path.stem,
        seed=job.seed,
        epochs=job.epochs,
        expected_tokens_per_s=job.expected_tokens_per_s,
        model=model,
        data=data,
        cluster=cluster,
        checkpoint=checkpoint,
        zero=zero,
        extra=extra,
        text=text,
    )


def _model(reader: Reader, table: Any) -> ModelConfig | None:
    """``[model]``, with its spec: the preset's or the model directory's config.json, overridden."""
    model = reader.read(ModelConfig, table, "model")
    if model is None:
        return None
    if (model.preset is None) == (model.path is None):
        got = "neither" if model.preset is None else "both"
        reader.problem("model.preset", f"expected exactly one of model.preset or model.path, got {got}")
        return None
    if model.preset is not None:
        spec = PRESETS[model.preset]
    else:
        assert model.path is not None
        try:
            spec = from_hf_config(model.path)
        except (OSError, ValueError) as exc:
            reader.problem("model.path", f"cannot read the model's config.json: {exc}")
            return None
    spec = spec.with_overrides(
        vocab_size=model.vocab_size, max_positions=model.max_positions, params=model.params
    )
    return replace(model, spec=spec, tokenizer=model.tokenizer or model.path)
