"""Linear scaling: the lr and steps that would follow a change of the batch factorization.

Keeping ``lr / effective batch`` fixed keeps each sample's weight in an update; keeping the
remaining samples fixed ends the run on the same data budget. Nothing applies it: the
trainer's banner, ``reshard-plan`` and ``verify-resume`` suggest it, in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_tools.format.record import BatchFactorization


@dataclass(frozen=True)
class LinearScaling:
    before: BatchFactorization
    after: BatchFactorization
    lr_before: float | None
    lr_after: float | None
    steps_before: int | None
    steps_after: int | None  # the same remaining samples at the new samples per step
    remaining_samples: int | None

    @property
    def unchanged(self) -> bool:
        """Nothing to adjust: the same effective batch, and the same number of steps to go."""
        return self.before.effective_batch_size == self.after.effective_batch_size and (
            self.steps_after == self.steps_before
        )

    def describe(self) -> str:
        """``linear scaling suggests --optimizer.lr=... and --steps=...``; empty when there is nothing to say."""
        parts = []
        if self.lr_after is not None and self.before.effective_batch_size != self.after.effective_batch_size:
            parts.append(
                f"--optimizer.lr={self.lr_after:.3g}"
                f" (lr × {self.after.effective_batch_size}/{self.before.effective_batch_size})"
            )
        if self.steps_after is not None and self.steps_after != self.steps_before:
            parts.append(
                f"--steps={self.steps_after} (the same {self.remaining_samples} remaining samples"
                f" at {self.after.samples_per_step}/step)"
            )
        return "linear scaling suggests " + " and ".join(parts) if parts else ""


def linear_scaling(
    before: BatchFactorization,
    after: BatchFactorization,
    *,
    lr: float | None,
    steps: int | None,
    step: int = 0,
) -> LinearScaling:
    """Scale ``lr`` with the effective batch, and the ``steps`` left after ``step`` with the samples per step.

    A batch of no samples (refused by the start-up rules, which say so) has nothing to scale by.
    """
    sizes = (before.effective_batch_size, after.effective_batch_size, before.samples_per_step, after.samples_per_step)
    if min(sizes) <= 0:
        return LinearScaling(before, after, lr, None, steps, steps, None)
    ratio = after.effective_batch_size / before.effective_batch_size
    remaining, steps_after = None, steps
    if steps is not None:
        remaining = max(0, steps - step) * before.samples_per_step
        steps_after = step + -(-remaining // after.samples_per_step)
    return LinearScaling(before, after, lr, lr * ratio if lr is not None else None, steps, steps_after, remaining)
