"""Paper reproductions: the same entry point as ``horizonrl reproduce NAME [flags]``.

    python benchmarks/reproduce.py rtpo --jobs 2
    python benchmarks/reproduce.py list

See docs/reproduce.md for what a reproduction runs and what its page reports.
"""

from __future__ import annotations

import sys

from horizonrl.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", *sys.argv[1:]]))
