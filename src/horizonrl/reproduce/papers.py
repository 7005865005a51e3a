"""The papers' comparisons as :class:`~horizonrl.reproduce.spec.Paper` declarations.

Each declaration is the regime (task, model, warm start), the arms and the claims
to test; ``horizonrl reproduce NAME`` runs it. The numbers these produce are in
``docs/results/NAME.md``.
"""

from __future__ import annotations

from horizonrl.reproduce.spec import Arm, Comparison, Paper, register_paper  # noqa: F401
