"""`python -m pyinfer` runs the command line."""

import sys

from pyinfer.cli import main

sys.exit(main())
