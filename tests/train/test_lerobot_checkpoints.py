"""``ckpt-train`` on checkpoints LeRobot wrote: refused with one line naming what is LeRobot's, never a config error.

ckpt-train builds only its own policies and reads none of LeRobot's optimizer or RNG files
(docs/resume.md, "Checkpoints LeRobot wrote"), so ``--resume`` refuses them before decoding their
train_config.json, and ``--policy.path`` refuses a LeRobot policy naming the fields that do not fit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError, ConfigError, ExitCode, LegacyCheckpoint
from ckpt_tools.train.parsing import parse_train_config
from devtools.training import train
from tests.support.lerobot_fixtures import main_run, v061_run


@pytest.mark.parametrize("name", ["single", "ddp", "fsdp"])
def test_resume_of_a_lerobot_0_6_checkpoint_is_the_0_6_refusal(name: str) -> None:
    with pytest.raises(LegacyCheckpoint) as refused:
        parse_train_config(["--resume=true", f"--config_path={v061_run(name)}/checkpoints/last"])
    message = str(refused.value)
    assert refused.value.exit_code == ExitCode.BAD_INPUT
    assert "a LeRobot 0.6.x checkpoint" in message and "cannot be resumed by ckpt-train" in message
    assert "its policy is LeRobot's act" in message and "lerobot-train --policy.path=" in message
    keyed = "parameter name" if name == "fsdp" else "position (state/<index>/<slot>)"
    assert f"optimizer state is keyed by {keyed}" in message
    if name == "fsdp":
        assert "only LeRobot 0.6.x, which wrote it, resumes it" in message
    else:
        assert "LeRobot resumes it: lerobot-train --resume=true --config_path=" in message


def test_resume_of_a_lerobot_main_checkpoint_is_refused_as_lerobots() -> None:
    with pytest.raises(CheckpointError) as refused:
        parse_train_config(["--resume=true", f"--config_path={main_run('fsdp-dcp')}/checkpoints/000004"])
    message = str(refused.value)
    assert not isinstance(refused.value, ConfigError) and refused.value.exit_code == ExitCode.BAD_INPUT
    assert "a LeRobot checkpoint (training_step.json with a parallelism snapshot)" in message
    assert "lerobot-train --resume=true --config_path=" in message


def test_policy_path_to_a_lerobot_policy_names_the_fields_that_do_not_fit() -> None:
    pretrained = main_run("single") / "checkpoints" / "last" / "pretrained_model"
    with pytest.raises(ConfigError) as refused:
        parse_train_config([f"--policy.path={pretrained}", "--dataset.root=fixtures/tiny_robot"])
    message = str(refused.value)
    assert "a LeRobot act policy" in message
    assert "fields ckpt-train's act policy does not have: n_obs_steps, input_features, output_features" in message
    assert message.endswith(f"lerobot-train --policy.path={pretrained}")


def test_a_decoding_error_says_what_did_not_decode(tmp_path: Path) -> None:
    config = tmp_path / "train_config.json"
    config.write_text('{"dataset": {"root": "fixtures/tiny_robot"}, "policy": {"type": "act", "use_vae": true}}')
    with pytest.raises(ConfigError) as refused:
        parse_train_config([f"--config_path={config}"])
    # draccus puts the reason on the lines below "... any of the given types:"; the message keeps them.
    assert str(refused.value).endswith(": PolicyConfig: The fields `use_vae` are not valid for ACTConfig")


def test_ckpt_train_exits_3_with_one_line_on_a_real_lerobot_0_6_checkpoint(tmp_path: Path) -> None:
    proc = train("--resume=true", f"--config_path={v061_run('single')}/checkpoints/last", f"--output_dir={tmp_path}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "a LeRobot 0.6.x checkpoint" in lines[0]
