"""`python -m gpufinops.cli ...`, the same as the `gpufinops` command."""

import sys

from .app import main

sys.exit(main())
