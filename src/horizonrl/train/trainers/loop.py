"""The one run loop every trainer shares: evaluate, advance, log, checkpoint.

A trainer implements four hooks; :meth:`Trainer.fit` does the rest::

    has_more() -> bool        another logged step runs (steps left, budget allows)
    advance()  -> metrics     one logged step (a group-trainer step, an RTPO stage)
    evaluate() -> metrics     held-out evaluation (its own RNG stream)
    save()                    an exactly-resumable checkpoint

and may refine ``eval_due()`` (default: every ``train.eval_every`` steps) and
``progress()`` (the fraction of the run done, for ``train.eval_fractions``).
Evaluation runs before a fresh run, whenever ``eval_due()`` or a fraction of
``train.eval_fractions`` is crossed, and after the last step; a checkpoint is
written every ``train.save_every`` steps and after the last one. A step whose
update is not finite (:class:`~horizonrl.errors.NonFiniteError`) ends the run
naming the step, before it is logged or saved. With ``train.progress`` a bar on
stderr counts the steps, and each evaluation run through
:func:`~horizonrl.train.rollout.collect.evaluate` shows its own (tasks done,
generated tokens/s; :func:`~horizonrl.train.rollout.progress.eval_progress`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from horizonrl.errors import NonFiniteError
from horizonrl.train.records.signal import STREAK_KEY, SignalWatch

if TYPE_CHECKING:
    from horizonrl.config import RunConfig
    from horizonrl.train.records.metrics import MetricsLogger, NullLogger


class Trainer:
    """Base class of the registered trainers (:mod:`horizonrl.train.trainers.registry`)."""

    #: Label of the progress bar's unit.
    unit = "step"
    #: The frozen config dataclass of ``train.trainer_params`` this trainer reads (None: it takes none).
    params_cls: type | None = None

    #: Logged steps done so far (a group-trainer step, an RTPO stage).
    step: int
    #: The run's config.
    cfg: RunConfig
    #: Where :meth:`fit` logs its records (a no-op logger off the main rank under torchrun).
    logger: MetricsLogger | NullLogger
    #: The fractions of ``train.eval_fractions`` already evaluated.
    evals_done: list[float]

    def has_more(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def advance(self) -> dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def progress(self) -> float:
        """Fraction of the run done (steps, or generated tokens when a token budget is set)."""
        steps = self.cfg.train.steps
        frac = self.step / steps if steps else 1.0
        budget = getattr(self, "budget", None)
        if budget is not None and budget.limit:
            frac = max(frac, budget.spent / budget.limit)
        return min(1.0, frac)

    def eval_due(self) -> bool:
        every = self.cfg.train.eval_every
        return bool(every) and self.step % every == 0

    def _fraction_due(self) -> bool:
        """Whether a not yet evaluated fraction of ``train.eval_fractions`` has been crossed."""
        done = self.progress()
        due = [f for f in self.cfg.train.eval_fractions if f <= done and f not in self.evals_done]
        self.evals_done.extend(due)
        return bool(due)

    def _evaluate(self) -> dict[str, Any]:
        """:meth:`evaluate`, showing its progress when ``train.progress`` is on (same metrics either way)."""
        from horizonrl.train.rollout.progress import eval_progress

        with eval_progress(self.cfg.train.progress):
            return self.evaluate()

    def signal_watch(self) -> SignalWatch:
        """The run's :class:`SignalWatch` (one per trainer; a trainer that checkpoints it resumes its
        streak, so a resumed run logs what an uninterrupted one does)."""
        if getattr(self, "_signal", None) is None:
            self._signal = SignalWatch(patience=self.cfg.train.no_signal_steps)
        return self._signal

    def postfix(self, m: dict[str, Any]) -> dict[str, str]:
        out = {
            "reward": f"{m.get('reward/mean', 0.0):.2f}",
            "ratio": f"{m.get('train/ratio_geomean', 1.0):.4f}",
        }
        streak = m.get(STREAK_KEY, 0.0)
        if streak >= max(1, self.cfg.train.no_signal_steps):
            out["signal"] = f"none for {int(streak)} steps"
        return out

    def fit(self, progress_cb=None) -> list[dict[str, Any]]:
        """Train until :meth:`has_more` is false; returns every logged record."""
        cfg = self.cfg.train
        records = []
        if self.step == 0 and cfg.eval_at_start:
            records.append(self.logger.log(0, self._evaluate()))
        watch = self.signal_watch()
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            total = cfg.steps if self.unit == "step" else None
            bar = tqdm(total=total, initial=self.step, desc=cfg.trainer, unit=self.unit, dynamic_ncols=True)
        while self.has_more():
            step = self.step + 1
            try:
                m = self.advance()
            except NonFiniteError as e:  # name the step; nothing of it is logged or saved
                raise NonFiniteError(f"{self.unit} {step}: {e}") from None
            watch.observe(self.step, m)
            last = not self.has_more()
            fraction = self._fraction_due()
            if last or self.eval_due() or fraction:
                m.update(self._evaluate())
            records.append(self.logger.log(self.step, m))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(self.postfix(m))
            if progress_cb is not None:
                progress_cb(self.step, m)
            if last or (cfg.save_every and self.step % cfg.save_every == 0):
                self.save()
        if bar is not None:
            bar.close()
        self.logger.close()
        return records
