"""The action engine's ports: everything through which it touches the world outside its own state -
commands it runs (py-spy, nvidia-smi, the kill hook, scancel), the signals it sends, the clock, the
random source of its retry jitter and its own pid (never signalled). One bundle, so a test replaces a
port by name and the engine's constructor stays small."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_triage.actions.kill_targets import CommandRunner, OsSignaller, Signaller, SubprocessRunner


@dataclass(frozen=True, slots=True)
class EnginePorts:
    """The real ports by default."""

    runner: CommandRunner = field(default_factory=SubprocessRunner)
    signaller: Signaller = field(default_factory=OsSignaller)
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    own_pid: int = field(default_factory=os.getpid)


__all__ = ["EnginePorts"]
