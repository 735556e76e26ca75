"""`python -m cli ...` runs the `regent` command line (what tests and demos spawn)."""

import sys

from cli.main import main

sys.exit(main())
