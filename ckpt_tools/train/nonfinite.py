"""Non-finite losses and gradients: skip the update or stop the run, every rank the same way.

A NaN or infinite loss (or, without a loss scaler, gradient norm) poisons the weights and the
optimizer state at the next update, and every step and checkpoint after it. So the loop
checks each micro-step's loss and, before each optimizer update, the ranks agree (a
max all-reduce of two flags, and a third for a SIGTERM: :mod:`~ckpt_tools.train.stopping`)
whether any of them saw one: each rank's loss is its own, and a
rank that skipped or stopped alone would leave the others waiting in a collective forever.

``--max_nonfinite_steps=N`` lets a run skip N such updates (each one logged, the weights and
the optimizer state left as they were, the batch consumed); the next one stops it with one
line and exit code 7. The default 0 stops at the first. With a loss scaler (fp16), an
infinite gradient is the scaler's business - it skips that update and lowers its scale - so
only the loss is counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ckpt_tools.errors import NonFiniteError
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.stopping import StopRequest


@dataclass
class NonFiniteGuard:
    env: DistEnv
    max_skips: int  # --max_nonfinite_steps
    skipped: int = 0  # updates skipped by this process
    _bad_loss: float | None = None  # this rank's first non-finite loss since the last update

    def observe(self, loss: float) -> None:
        """One micro-step's loss on this rank (no collective)."""
        if not math.isfinite(loss) and self._bad_loss is None:
            self._bad_loss = loss

    def agree(self, grad_norm: float | None, stop: StopRequest | None = None) -> str | None:
        """Collective, once per accumulation window before its update: why every rank skips it, or None.

        ``grad_norm`` is the window's global gradient norm, or None when a loss scaler judges it.
        ``stop``: the run's SIGTERM request, agreed in the same all-reduce (one collective a step
        instead of two; the loop's own check at the end of the step then needs none).
        """
        bad_loss = self._bad_loss is not None
        bad_grad = grad_norm is not None and not math.isfinite(grad_norm)
        if self.env.distributed:
            requested = stop is not None and stop.requested
            flags = torch.tensor([int(bad_loss), int(bad_grad), int(requested)], device=self.env.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            bad_loss, bad_grad = bool(flags[0].item()), bool(flags[1].item())
            if stop is not None:
                stop.settle(bool(flags[2].item()))
        mine, self._bad_loss = self._bad_loss, None
        if bad_loss:
            return f"the loss is {mine}" if mine is not None else "the loss is not finite on another rank"
        if bad_grad:
            return f"the gradient norm is {grad_norm}"
        return None

    def skip_or_stop(self, step: int, reason: str, last_checkpoint: Callable[[], str]) -> str:
        """Count a skipped update: the warning to log, or :class:`NonFiniteError` once over the limit.

        ``last_checkpoint`` names the checkpoint the run leaves (called only when it stops).
        """
        self.skipped += 1
        if self.skipped > self.max_skips:
            if self.max_skips:
                why = f"after {self.max_skips} skipped updates, the most --max_nonfinite_steps={self.max_skips} allows"
                hint = "lower --optimizer.lr or check the dataset"
            else:
                why = "its update was not applied"
                hint = "lower --optimizer.lr, check the dataset, or pass --max_nonfinite_steps=N to skip such steps"
            raise NonFiniteError(
                f"step {step}: {reason}; training stopped ({why}); last complete checkpoint: {last_checkpoint()}"
                f" ({hint})"
            )
        return (
            f"warning: step {step}: {reason}; update skipped ({self.skipped} of --max_nonfinite_steps={self.max_skips})"
        )
