import sys

from watchdog.cli import main

sys.exit(main())
