"""``ft-trainer train``: DeepSpeed ZeRO-3 full fine-tuning (see :mod:`ft_trainer.train.loop`).

``python -m ft_trainer.train --config job.toml`` is the same command as ``ft-trainer train`` and also
accepts the ``--local_rank=N`` argument the ``deepspeed`` launcher appends (ranks read ``LOCAL_RANK``).
Importing this package loads neither torch nor DeepSpeed.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from ft_trainer.train.command import run_train

    p = argparse.ArgumentParser(prog="python -m ft_trainer.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="job TOML")
    p.add_argument("--local_rank", "--local-rank", type=int, help="ignored (LOCAL_RANK is read)")
    p.add_argument("-v", "--verbose", action="store_true", help="INFO logs on every rank")
    return run_train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
