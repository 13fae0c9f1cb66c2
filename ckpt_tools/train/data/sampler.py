"""A resumable, topology-independent sampler over one global stream of samples.

The data is one infinite stream: epoch e is a permutation of the dataset seeded by
``seed + e``, and the epochs follow each other. A run's position is a single number, the
samples consumed so far (``samples_seen``). On a step, rank r of W takes
``stream[p + r·B : p + (r+1)·B]`` and the position advances by ``W·B``.

Why this shape: resuming needs nothing but ``samples_seen``. With the same world size and
batch size the resumed run sees exactly the samples, ranks and order of an uninterrupted
one; with different ones the same global order is split differently, so within the epoch
no sample is skipped or repeated - only the grouping into batches changes.
"""

from __future__ import annotations

import torch

from ckpt_tools.format.record import SamplerPosition


class GlobalOrderSampler:
    def __init__(self, dataset_size: int, seed: int, batch_size: int, rank: int, world_size: int) -> None:
        if dataset_size <= 0:
            raise ValueError("empty dataset")
        self.dataset_size = dataset_size
        self.seed = seed
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.samples_seen = 0
        self._epoch_cached = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch_cached:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._perm = torch.randperm(self.dataset_size, generator=generator)
            self._epoch_cached = epoch
        return self._perm

    def stream(self, start: int, count: int) -> torch.Tensor:
        """Dataset indices at global stream positions ``start … start+count-1``."""
        out = torch.empty(count, dtype=torch.long)
        filled = 0
        while filled < count:
            pos = start + filled
            epoch, offset = divmod(pos, self.dataset_size)
            take = min(count - filled, self.dataset_size - offset)
            out[filled : filled + take] = self._permutation(epoch)[offset : offset + take]
            filled += take
        return out

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.world_size

    def next_indices(self) -> torch.Tensor:
        """This rank's batch for the current step; advances the global position."""
        start = self.samples_seen + self.rank * self.batch_size
        indices = self.stream(start, self.batch_size)
        self.samples_seen += self.samples_per_step
        return indices

    def position(self) -> SamplerPosition:
        epoch, offset = divmod(self.samples_seen, self.dataset_size)
        return SamplerPosition(epoch=epoch, offset=offset, seed=self.seed, dataset_size=self.dataset_size)

    def restore(self, samples_seen: int) -> None:
        self.samples_seen = samples_seen
