"""``python -m ft_trainer.train --config job.toml`` (see :mod:`ft_trainer.train`)."""

import sys

from ft_trainer.train import main

sys.exit(main())
