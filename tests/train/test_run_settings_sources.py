"""The trainer and the tools read the start-up rules' values through one declaration.

The trainer reads :class:`RunSettings` off its config dataclasses; ``reshard-plan`` and
``verify-resume`` read it off the ``train_config.json`` that config saves. Both must give the same
values, or a checkpoint the trainer accepted would be judged otherwise by the tools.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ckpt_tools.format.rules.run_settings import RunSettings, declared_flags
from ckpt_tools.format.train_config import SavedConfig, read_saved_config, top_level_mismatch
from ckpt_tools.train.config import TrainConfig, train_config_dict
from ckpt_tools.train.parsing import flag_names, parse_train_config
from devtools.training import TINY
from tests.support.train_cli import RULE_SETTINGS

EVERY_SETTING = [
    *RULE_SETTINGS,
    "--seed=7",
    "--checkpoint.load=model,optimizer",
    "--ema.enable=true",
    "--ema.decay=0.99",
    "--ema.update_after_step=5",
    "--peft.r=4",
]

CASES = {
    "defaults": [],
    "every setting": EVERY_SETTING,
    "peft": ["--peft.method_type=lora", "--peft.r=4", "--accelerator.fsdp.min_num_params=1000"],
    "non-finite": ["--optimizer.lr=nan", "--optimizer.betas=[0.9,inf]", "--ema.power=-inf"],
    "mlp": [a for a in TINY if not a.startswith("--policy.")] + ["--policy.type=mlp", "--policy.hidden_dim=16"],
}


def _read_both(tmp_path: Path, flags: list[str]) -> tuple[RunSettings, RunSettings]:
    """(the trainer's own reading, the tools' reading of the train_config.json it saves)."""
    policy = [] if any(f.startswith("--policy.type=") for f in flags) else TINY
    cfg, _ = parse_train_config([*policy, *flags, f"--output_dir={tmp_path / 'out'}"])
    saved = tmp_path / "train_config.json"  # not in a checkpoint: its paths read as given, as the trainer's
    saved.write_text(json.dumps(train_config_dict(cfg)))
    return cfg.run_settings(), read_saved_config(saved).run_settings()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_trainer_and_the_tools_read_the_same_settings(tmp_path: Path, case: str) -> None:
    trainer, tools = _read_both(tmp_path, CASES[case])
    assert repr(trainer) == repr(tools)  # repr: a NaN equals itself there


def test_every_declared_setting_is_read_from_a_flag_the_trainer_takes(tmp_path: Path) -> None:
    """A misspelt dotted flag would read None on both sides, and its rule would never be checked."""
    declared = declared_flags()
    assert {flag for flag, _ in declared.values()} <= flag_names()
    trainer, _ = _read_both(tmp_path, [*EVERY_SETTING, f"--checkpoint.load_from={tmp_path}"])
    unset = {name for name in declared if getattr(trainer, name) is None}
    assert unset == {"min_num_params", "policy_path"}  # exclusive with wrap_modules; needs a saved policy
    assert (trainer.min_lr_ratio, trainer.keep_last_n, trainer.betas) == (0.2, 3, [0.8, 0.99])


def test_a_value_of_the_wrong_type_reads_as_none_for_the_tools() -> None:
    raw = {
        "steps": True,
        "seed": 1.5,
        "optimizer": {"lr": "1e-4", "betas": [0.9, "x"], "type": 3},
        "accelerator": {"fsdp": {"wrap_modules": "Layer", "mixed_precision_policy": "bf16"}},
        "peft": "yes",
        "resume": "true",
        "ema": {"enable": 1},
        "policy": {"path": 5},
    }
    s = SavedConfig(Path("train_config.json"), raw).run_settings()
    assert (s.steps, s.seed, s.lr, s.betas, s.optimizer_type, s.wrap_modules) == (None,) * 6
    assert (s.mixed_precision_policy, s.peft, s.resume, s.ema_enable, s.policy_path) == ({}, False, False, None, None)
    assert s.ema_schedule is not None and s.ema_schedule.decay is None  # a group, its missing fields default


def test_the_trainer_config_must_match_the_top_level_the_tools_accept() -> None:
    """train/config.py runs this check at import; a field added on one side only stops every trainer start."""
    assert top_level_mismatch(TrainConfig) is None

    @dataclasses.dataclass
    class Extended(TrainConfig):
        notes: str | None = None

    assert top_level_mismatch(Extended) == (
        "Extended and ckpt_tools/format/train_config.py disagree: CONFIG_SCALARS lacks ['notes'] and lists []"
    )
