"""The dataset's features against the LeRobot policy they resume (ckpt_tools.format.rules.lerobot_features).

LeRobot's ``make_policy`` takes the policy's outputs from the dataset and keeps the saved inputs: a
dataset that lost a feature the policy uses, or changed its shape, stops ``lerobot-train
--resume=true``; a feature the policy does not use does not. The checkpoints are the real ones LeRobot
wrote (fixtures/lerobot); the tests copy a run and its dataset and edit the copy's meta/info.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt_tools.format.rules.lerobot_features import feature_problems
from ckpt_tools.resume.verify import verify_resume
from tests.support.lerobot_fixtures import main_run, run_id, v061_run

RUNS = [main_run("single"), main_run("fsdp-dcp"), v061_run("single")]


def dataset_check(report) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    check = next(c for c in report.checks if c.name == "dataset")
    return check.status, check.message


def copy_run(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The run and its dataset copied side by side (train_config.json records dataset.root = "dataset")."""
    label = tmp_path / run.parent.name
    shutil.copytree(run, label / run.name, symlinks=True)
    shutil.copytree(run.parent / "dataset", label / "dataset")
    return label / run.name / "checkpoints", label / "dataset" / "meta" / "info.json"


def edit_features(info_file: Path, edit: Any) -> None:
    info = json.loads(info_file.read_text())
    edit(info["features"])
    info_file.write_text(json.dumps(info, indent=4))


def saved_policy(run: Path) -> dict[str, Any]:
    config = run / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    return json.loads(config.read_text())["policy"]


def dataset_features(run: Path) -> dict[str, Any]:
    return json.loads((run.parent / "dataset" / "meta" / "info.json").read_text())["features"]


@pytest.mark.parametrize("run", RUNS, ids=run_id)
def test_the_datasets_lerobot_trained_on_fit_their_policies(run: Path) -> None:
    assert feature_problems(saved_policy(run), dataset_features(run)) == []
    report = verify_resume(run / "checkpoints")
    assert report.resumable
    assert dataset_check(report) == (
        "pass",
        f"--dataset.root={run.parent / 'dataset'} (120 frames; its features fit the policy)",
    )


@pytest.mark.parametrize("run", RUNS, ids=run_id)
@pytest.mark.parametrize(
    "edit, line",
    [
        (
            lambda f: f.pop("observation.environment_state"),
            "observation.environment_state: the policy's input feature [7] is not in the dataset"
            " - the first batch lacks it (KeyError in the policy's forward)",
        ),
        (
            lambda f: f["observation.state"].update(shape=[8]),
            "observation.state: the dataset's shape [8], the policy's [7]"
            " - the checkpoint's normalizer statistics and input layer have the saved width",
        ),
        (
            lambda f: f.pop("action"),
            "action: the policy's output feature [7] is not in the dataset"
            " - make_policy takes the policy's outputs from the dataset and cannot rebuild this policy",
        ),
        (
            lambda f: f["action"].update(shape=[6]),
            "action: the dataset's shape [6], the policy's [7]"
            " - the saved weights do not fit the policy make_policy builds from it",
        ),
    ],
    ids=["input-dropped", "input-reshaped", "action-dropped", "action-reshaped"],
)
def test_a_dataset_that_no_longer_fits_the_policy_is_not_resumable(
    run: Path, edit: Any, line: str, tmp_path: Path
) -> None:
    checkpoints, info_file = copy_run(run, tmp_path)
    edit_features(info_file, edit)
    report = verify_resume(checkpoints)
    assert not report.resumable
    status, message = dataset_check(report)
    assert status == "fail" and message == f"--dataset.root={info_file.parent.parent} does not fit the policy: {line}"


def test_every_problem_is_counted(tmp_path: Path) -> None:
    checkpoints, info_file = copy_run(main_run("single"), tmp_path)
    edit_features(info_file, lambda f: (f.pop("action"), f.pop("observation.state")))
    _, message = dataset_check(verify_resume(checkpoints))
    assert message.startswith(f"--dataset.root={info_file.parent.parent} does not fit the policy: observation.state:")
    assert message.endswith(" (+1 more)")


def test_a_feature_the_policy_does_not_use_is_no_problem() -> None:
    """make_policy keeps the saved input features: another observation or camera is not fed to the policy."""
    run = main_run("single")
    features = dataset_features(run) | {
        "observation.velocity": {"dtype": "float32", "shape": [3], "names": None},
        "observation.images.wrist": {"dtype": "video", "shape": [48, 64, 3], "names": ["height", "width", "channels"]},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
    }
    assert feature_problems(saved_policy(run), features) == []


def image_policy(shape: list[int]) -> dict[str, Any]:
    policy = saved_policy(main_run("single"))
    policy["input_features"]["observation.images.top"] = {"type": "VISUAL", "shape": shape}
    return policy


def image(shape: list[int], names: list[str] | None, dtype: str = "video") -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "names": names}


def test_images_are_compared_channel_first_as_dataset_to_policy_features_turns_them() -> None:
    features = dataset_features(main_run("single"))
    hwc = image([48, 64, 3], ["height", "width", "channels"])
    assert feature_problems(image_policy([3, 48, 64]), features | {"observation.images.top": hwc}) == []
    # LeRobot compares no image sizes (ACT's backbone takes any): another size is not a failure.
    assert feature_problems(image_policy([3, 96, 128]), features | {"observation.images.top": hwc}) == []
    # An image feature that is not 3-D stops dataset_to_policy_features, used or not.
    flat = features | {"observation.images.side": image([48, 64], ["height", "width"])}
    assert feature_problems(saved_policy(main_run("single")), flat) == [
        "observation.images.side: Number of dimensions != 3 (shape=[48, 64]) - dataset_to_policy_features refuses it"
    ]


def test_a_missing_camera_is_refused_by_make_policy_unless_renamed() -> None:
    features = dataset_features(main_run("single"))
    other = features | {"observation.images.side": image([48, 64, 3], ["height", "width", "channels"])}
    assert feature_problems(image_policy([3, 48, 64]), other) == [
        "observation.images.top: the policy's input feature [3, 48, 64] is not in the dataset"
        " - make_policy refuses it (Feature mismatch between dataset/environment and policy config)"
    ]
    # No camera at all passes validate_visual_features_consistency; the first batch then lacks it.
    assert feature_problems(image_policy([3, 48, 64]), features)[0].endswith(
        "the first batch lacks it (KeyError in the policy's forward)"
    )
    # --rename_map maps the dataset's camera onto the policy's.
    assert (
        feature_problems(image_policy([3, 48, 64]), other, {"observation.images.side": "observation.images.top"}) == []
    )
    # Stored as numbers, not an image or video, it is no camera.
    as_numbers = features | {"observation.images.top": image([3, 48, 64], None, dtype="float32")}
    assert feature_problems(image_policy([3, 48, 64]), as_numbers)[0].startswith(
        "observation.images.top: the policy's input feature [3, 48, 64] is a STATE feature in the dataset"
    )


def test_a_hub_dataset_is_said_to_be_unchecked(tmp_path: Path) -> None:
    checkpoints, _ = copy_run(main_run("single"), tmp_path)
    config_file = checkpoints / "last" / "pretrained_model" / "train_config.json"
    config = json.loads(config_file.read_text())
    config["dataset"]["root"] = None
    config_file.write_text(json.dumps(config, indent=4))
    status, message = dataset_check(verify_resume(checkpoints))
    assert status == "pass" and "--dataset.repo_id=ckpt_tools/tiny_robot" in message
    assert "not checked here: neither its files nor whether its features fit the policy" in message
