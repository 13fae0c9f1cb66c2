"""``ckpt-train``'s entry point called inside the test process, for what it decides before any process group.

A refusal at start-up, ``--help``, "nothing to do": the entry point exits before torch
distributed starts, so the test needs no launch. Only for those: on a set-up it accepts,
the entry point would go on and train in the test process.
"""

from __future__ import annotations

import subprocess

import pytest

from ckpt_tools.train.cli import main

# A value for every setting the start-up rules read that a plain run can combine (no seed, PEFT,
# EMA or load parts: the tests add the ones they are about).
RULE_SETTINGS = [
    "--steps=9",
    "--batch_size=4",
    "--save_freq=6",
    "--log_freq=3",
    "--collective_timeout_s=30",
    "--accelerator.gradient_accumulation.steps=2",
    "--checkpoint_format=dcp",
    "--optimizer.lr=3e-4",
    "--scheduler.type=constant",
    "--accelerator.mixed_precision=fp16",
    '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]',
    r"--accelerator.fsdp.ignored_modules=encoder\..*",
    "--accelerator.fsdp.mixed_precision_policy.param_dtype=float16",
    "--accelerator.fsdp.mixed_precision_policy.cast_forward_inputs=false",
    "--parallelism.dp_replicate=2",
    "--parallelism.dp_shard=-1",
    "--optimizer.weight_decay=0.01",
    "--optimizer.betas=[0.8,0.99]",
    "--optimizer.eps=1e-6",
    "--optimizer.grad_clip_norm=0",
    "--scheduler.warmup_steps=3",
    "--scheduler.min_lr_ratio=0.2",
    "--policy.dropout=0.0",
    "--max_nonfinite_steps=2",
    "--checkpoint.keep_last_n=3",
    "--checkpoint.last_link=file",
]


def exits_in_process(argv: list[str], capsys: pytest.CaptureFixture[str], code: int) -> tuple[str, str]:
    """Run the entry point on ``argv``: it must exit with ``code``; its (stdout, stderr)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out, captured.err


def refused_in_process(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """The one line the entry point prints for a start-up refusal (exit ``code``, nothing on stdout)."""
    out, err = exits_in_process(argv, capsys, code)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not out
    return lines[0]


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """The entry point on ``argv`` as a finished-process record, for a launch that ends before any
    process group (a dry run, a start-up refusal); a launch that went on would train in this process."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    captured = capsys.readouterr()
    code = stopped.value.code
    return subprocess.CompletedProcess(
        ["ckpt-train", *argv], 0 if code is None else code if isinstance(code, int) else 1, captured.out, captured.err
    )
