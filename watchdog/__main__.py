import sys

from gpu_triage.cli import main

sys.exit(main())
