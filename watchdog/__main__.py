import sys

from gpu_triage.cli.main import main

sys.exit(main())
