"""`python -m dstrain.launcher ...` is the `dstrain` command."""

import sys

from .cli import main

sys.exit(main())
