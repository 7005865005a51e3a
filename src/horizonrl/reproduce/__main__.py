"""Subprocess entry point of one arm-seed run: ``python -m horizonrl.reproduce JOB_JSON``.

A package ``__main__`` rather than ``python -m horizonrl.reproduce.runner``: the package imports the
runner, and running an already-imported module as ``__main__`` makes runpy warn in every job log.
"""

import sys

from horizonrl.reproduce.runner import main

sys.exit(main())
