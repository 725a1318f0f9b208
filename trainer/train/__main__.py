"""``python -m trainer.train --config job.toml`` (see :mod:`trainer.train`)."""

import sys

from trainer.train import main

sys.exit(main())
