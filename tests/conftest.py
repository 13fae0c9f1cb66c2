"""Shared fixtures: the real training runs that several test modules inspect or resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.training import TINY, ok, train

RUN = [*TINY, "--steps=8", "--save_freq=4", "--log_samples=true"]


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    out = {name: root / name for name in ("ddp", "fsdp", "hsdp")}
    ok(train(*RUN, f"--output_dir={out['ddp']}", nproc=2))
    ok(
        train(
            *RUN,
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out['fsdp']}",
            nproc=2,
        )
    )
    hsdp = ok(
        train(
            *RUN,
            "--batch_size=4",
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            f"--output_dir={out['hsdp']}",
            nproc=4,
        )
    )
    (root / "hsdp.stdout").write_text(hsdp.stdout)
    return out
