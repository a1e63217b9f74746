"""Auto-tuning of credit and partition size from measured step time.

ByteScheduler tunes once, at the start, with only rank 0 deciding over a side channel, and its
partition tuning writes one attribute while the scheduler reads another. Here:

* **One rank decides, the team agrees.** Every ``period`` steps every rank posts a small
  broadcast from rank 0 (tagged, outside credit, most urgent) carrying ``(apply_step, credit,
  partition)``; every rank waits for it at step ``apply_step`` (the next one: it arrived long
  before) and applies it then. All ranks change at the same step boundary, without a barrier in
  the step.
* **The search** is Optuna's (ask-and-tell with its TPE sampler, seeded): each trial is a
  (credit, partition) pair on a power-of-two grid, measured as the mean step time over
  ``trial_steps`` steps after ``warmup_steps`` to settle; the starting settings are the first
  trial, so tuning never ends worse than it began. After ``trials`` trials the best is applied.
* **Re-tuning**: once tuned, the median step time of the last ``window`` steps is compared with
  the best trial's; a drift beyond ``drift`` (a fraction) starts a new search, seeded with the
  current best.
* **Both knobs act**: credit is the engine's (``ctx.credit_bytes``), read whenever it starts a
  task; partition is the scheduler's (``Scheduler.partition_bytes``), read whenever it cuts a
  tensor. Tests check both change what is sent.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, List, Optional, Tuple

import numpy as np

from pycoll import config

_KEEP = -1


class AutoTuner:
    """Tunes a :class:`~pycoll.scheduling.Scheduler`'s credit and/or partition size.

    Args:
        credit, partition: which knobs to tune.
        trials: trials per search.
        trial_steps: measured steps per trial (after ``warmup_steps``).
        period: steps between decisions (a decision is one small broadcast).
        drift: relative change of step time that starts a new search (default ``PYCOLL_SCHED_DRIFT``).
        window: steps whose median is compared with the tuned step time.
        credit_range, partition_range: (low, high) bytes searched, rounded to powers of two
            (credit's high end defaults to the bytes submitted in a step).
        seed: the sampler's seed.
    """

    def __init__(self, *, credit: bool = True, partition: bool = False, trials: int = 12,
                 trial_steps: int = 3, warmup_steps: int = 1, period: int = 1, drift: Optional[float] = None,
                 window: int = 10, credit_range: Optional[Tuple[int, int]] = None,
                 partition_range: Tuple[int, int] = (64 << 10, 64 << 20), seed: int = 0) -> None:
        if not (credit or partition):
            raise ValueError("AutoTuner: tune credit, partition or both")
        if trials < 1 or trial_steps < 1 or warmup_steps < 0 or period < 1 or window < 2:
            raise ValueError("AutoTuner: trials, trial_steps, period >= 1; warmup_steps >= 0; window >= 2")
        self.tune_credit = credit
        self.tune_partition = partition
        self.trials = trials
        self.trial_steps = trial_steps
        self.warmup_steps = warmup_steps
        self.period = period
        self.drift = config.get("PYCOLL_SCHED_DRIFT") if drift is None else float(drift)
        self.window = window
        self.credit_range = credit_range
        self.partition_range = partition_range
        self.seed = seed
        self.sched: Any = None
        # agreed state (every rank)
        self._pending: Optional[tuple] = None  # (apply_step, buffer, request)
        self.searches = 0  # searches started (rank 0 decides; everyone counts applied changes)
        # rank 0's state
        self.state = "idle"  # idle -> tuning -> tuned (-> tuning on drift)
        self._study: Any = None
        self._trial: Any = None
        self._trial_config: Optional[Tuple[int, int]] = None
        self._trials_done = 0
        self._active = 0  # id of the configuration the current step runs under
        self._epoch = 0  # the last decision applied that started a measurement
        self._decided = 0  # rank 0: decisions that start a measurement, so far
        self._applied_at = 0
        self._samples: List[Tuple[int, int, float]] = []  # (config id, step, seconds)
        self.best: Optional[Tuple[int, int]] = None
        self.best_time = math.inf
        self.log: List[tuple] = []  # rank 0: (step, event, credit, partition, seconds)

    @classmethod
    def from_setting(cls, text: Any) -> Optional[AutoTuner]:
        """A tuner for ``PYCOLL_SCHED_TUNING``-style text: ``off``, ``credit``, ``partition``,
        ``credit,partition``."""
        words = {w.strip().lower() for w in str(text).split(",") if w.strip()}
        if not words or words <= {"off", "0", "none", "false"}:
            return None
        bad = words - {"credit", "partition"}
        if bad:
            raise ValueError(f"tuning must be 'off' or a list of 'credit', 'partition', got {text!r}")
        return cls(credit="credit" in words, partition="partition" in words)

    def bind(self, sched: Any) -> None:
        self.sched = sched

    # ------------------------------------------------------------------ every rank, every step
    def on_step(self, step: int, seconds: float) -> None:
        """Step ``step`` ended after ``seconds``: record it, apply what was agreed for this step,
        post the next decision."""
        sched = self.sched
        self._samples.append((self._active, step, seconds))
        pending = self._pending
        if pending is not None and pending[0] <= step:
            self._pending = None
            pending[2].wait()
            _, credit, partition, search, epoch = (int(v) for v in pending[1])
            if credit != _KEEP or partition != _KEEP:
                sched.apply(None if credit == _KEEP else credit, None if partition == _KEEP else partition)
            if epoch != self._epoch:  # a new trial (or the tuned settings) from this step on
                self._epoch = epoch
                self._active += 1
                self._applied_at = step
            self.searches = search
        if step % self.period == 0 and self._pending is None:
            buf = np.full(5, _KEEP, dtype=np.int64)
            buf[0] = step + 1
            if sched.team.rank == 0:
                credit, partition = self._decide(step)
                buf[1], buf[2], buf[3], buf[4] = credit, partition, self.searches, self._decided
            req = sched.team.submit("bcast", buf, 0, tag="pycoll-tune", credit=False,
                                    priority=-(1 << 62), name=f"tune@{step}")
            self._pending = (step + 1, buf, req)

    # ------------------------------------------------------------------ rank 0
    def _measured(self) -> List[float]:
        """Step times of the active configuration, after its warm-up steps."""
        first = self._applied_at + self.warmup_steps
        return [s for cid, step, s in self._samples if cid == self._active and step > first]

    def _current(self) -> Tuple[int, int]:
        return self.sched.ctx.credit_bytes, self.sched.partition_bytes

    def _decide(self, step: int) -> Tuple[int, int]:
        """(credit, partition) to apply next step, ``_KEEP`` for either that stays."""
        if self.state == "idle":
            if step < 1:
                return _KEEP, _KEEP
            self._start_search(step, self._current())
            return self._next_trial(step)
        times = self._measured()
        if self.state == "tuning":
            if self._trial is None or len(times) < self.trial_steps:
                return _KEEP, _KEEP
            value = statistics.fmean(times)
            self._study.tell(self._trial, value)
            self.log.append((step, "trial", *self._trial_config, value))
            if value < self.best_time:
                self.best_time, self.best = value, self._trial_config
            self._trials_done += 1
            if self._trials_done < self.trials:
                return self._next_trial(step)
            self.state = "tuned"
            self._trial = None
            self._samples.clear()
            self.log.append((step, "tuned", *self.best, self.best_time))
            self._decided += 1
            return self._changes(self.best)
        # tuned: watch for drift
        if len(times) < self.window:
            return _KEEP, _KEEP
        recent = statistics.median(times[-self.window:])
        if abs(recent - self.best_time) > self.drift * self.best_time:
            self.log.append((step, "drift", *self._current(), recent))
            self._start_search(step, self._current())
            return self._next_trial(step)
        del self._samples[:-self.window]
        return _KEEP, _KEEP

    def _start_search(self, step: int, start: Tuple[int, int]) -> None:
        import optuna  # noqa: PLC0415 - optuna takes about a second to import: only when a search starts

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.searches += 1
        self.state = "tuning"
        self._trials_done = 0
        self.best, self.best_time = None, math.inf
        sampler = optuna.samplers.TPESampler(seed=self.seed + self.searches,
                                             n_startup_trials=max(2, self.trials // 3))
        self._study = optuna.create_study(direction="minimize", sampler=sampler)
        first = {}
        if self.tune_credit:
            first["credit_log2"] = min(max(_log2(start[0] or self._step_bytes()), self._credit_lo()),
                                       self._credit_hi())
        if self.tune_partition:
            lo, hi = (_log2(b) for b in self.partition_range)
            first["partition_log2"] = min(max(_log2(start[1] or self.partition_range[1]), lo), hi)
        self._study.enqueue_trial(first)  # the settings we start from are measured first
        self._samples.clear()
        self.log.append((step, "search", *start, 0.0))

    def _next_trial(self, step: int) -> Tuple[int, int]:
        trial = self._study.ask()
        credit, partition = self._current()
        if self.tune_credit:
            credit = 1 << trial.suggest_int("credit_log2", self._credit_lo(), self._credit_hi())
        if self.tune_partition:
            lo, hi = (_log2(b) for b in self.partition_range)
            partition = 1 << trial.suggest_int("partition_log2", lo, hi)
        self._trial, self._trial_config = trial, (credit, partition)
        self._decided += 1
        return self._changes((credit, partition))

    def _changes(self, config_: Tuple[int, int]) -> Tuple[int, int]:
        credit, partition = self._current()
        return (config_[0] if config_[0] != credit else _KEEP,
                config_[1] if config_[1] != partition else _KEEP)

    def _step_bytes(self) -> int:
        return max(1, self.sched.bytes_per_step or 1)

    def _credit_lo(self) -> int:
        return _log2(self.credit_range[0]) if self.credit_range else 16

    def _credit_hi(self) -> int:
        if self.credit_range:
            return max(self._credit_lo(), _log2(self.credit_range[1]))
        return max(self._credit_lo() + 1, math.ceil(math.log2(self._step_bytes())))

    def __repr__(self) -> str:
        knobs = "+".join(k for k, on in (("credit", self.tune_credit),
                                         ("partition", self.tune_partition)) if on)
        return f"<AutoTuner {knobs} {self.state}, best {self.best} at {self.best_time:.4g} s>"


def _log2(nbytes: int) -> int:
    return max(0, int(round(math.log2(max(1, nbytes)))))
