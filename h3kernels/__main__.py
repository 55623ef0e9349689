"""python -m h3kernels: the command line (h3kernels.cli)."""
import sys

from h3kernels.cli import main

sys.exit(main())
