"""Whether a resumed run sees exactly the samples an uninterrupted one would: "sample-exact".

The sampler splits one global stream of samples: on each step, rank r of W takes the r-th
``batch_size`` slice of the next ``W × batch_size`` samples, and a checkpoint saves the
position as ``samples_seen`` alone. Every resume therefore continues the same global order,
with no sample of the epoch skipped or repeated; each rank gets the very samples it would
have had only when ``dp_world_size`` and ``batch_size`` are both unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataOrderChange:
    """The data-parallel split before (the checkpoint) and after (the resumed run); None: unknown."""

    saved_dp_world_size: int | None
    saved_batch_size: int | None
    dp_world_size: int | None
    batch_size: int | None

    @property
    def sample_exact(self) -> bool | None:
        """True when each rank sees what it would have; None when either side is unknown."""
        sides = (self.saved_dp_world_size, self.saved_batch_size, self.dp_world_size, self.batch_size)
        if any(v is None for v in sides):
            return None
        return (self.saved_dp_world_size, self.saved_batch_size) == (self.dp_world_size, self.batch_size)

    def describe(self) -> str:
        """One line: the verdict and why."""
        exact = self.sample_exact
        if exact is None:
            return "unknown: dp_world_size / batch_size is not known for both the checkpoint and the resumed run"
        if exact:
            return f"sample-exact: same dp_world_size {self.dp_world_size} and batch_size {self.batch_size}"
        return (
            f"not sample-exact: dp_world_size {self.saved_dp_world_size} → {self.dp_world_size},"
            f" batch_size {self.saved_batch_size} → {self.batch_size}; the same global sample order is re-split,"
            " no sample of the epoch is skipped or repeated"
        )
