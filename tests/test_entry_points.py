"""The commands an install adds: its own, plus ``lerobot-convert-dcp``, never one that would shadow LeRobot's."""

from __future__ import annotations

from importlib.metadata import distribution


def test_the_install_adds_no_lerobot_train() -> None:
    scripts = {ep.name for ep in distribution("ckpt-tools").entry_points if ep.group == "console_scripts"}
    # lerobot-convert-dcp is the drop-in for LeRobot's converter (same flags, same output);
    # a lerobot-train here would replace LeRobot's own trainer in an environment that has both.
    assert scripts == {"ckpt-tools", "ckpt-train", "lerobot-convert-dcp"}
