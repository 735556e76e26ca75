"""`python -m regent.cli ...` runs the `regent` command line (what tests and demos spawn)."""

import sys

from regent.cli.main import main

sys.exit(main())
