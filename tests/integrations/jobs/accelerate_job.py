"""The accelerate example (docs/examples/accelerate_loop.py) with ``TEST_SLOW_SAVE_S`` added to every
``save_state`` (slow storage), so the daemon sees the save."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import accelerate_loop
from accelerate import Accelerator

SLOW_SAVE_S = float(os.environ.get("TEST_SLOW_SAVE_S", "0"))
_save_state = Accelerator.save_state


def slow_save_state(self: Accelerator, *args: Any, **kwargs: Any) -> Any:
    out = _save_state(self, *args, **kwargs)
    time.sleep(SLOW_SAVE_S)
    return out


Accelerator.save_state = slow_save_state  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(accelerate_loop.main(sys.argv[1:]))
