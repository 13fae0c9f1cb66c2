"""Write a tiny LeRobotDataset (codebase v3.0) from fixtures/tiny_robot, with LeRobot's own dataset API.

Runs under LeRobot's Python (started by bin/make-lerobot-fixtures), never under the project's:
fixtures/tiny_robot is the project's own flat safetensors layout, which LeRobot cannot read, so
its first episodes are replayed frame by frame through ``LeRobotDataset.create`` /
``add_frame`` / ``save_episode`` / ``finalize`` - the same calls ``lerobot-record`` makes.

ACT needs an image or an environment state among its inputs; the 14-dim tiny_robot state is
split into ``observation.state`` (the 7 joint positions) and ``observation.environment_state``
(the 7 joint velocities). No images, no videos: the dataset stays a few tens of KB.

    python make_dataset.py SRC_TINY_ROBOT OUT_ROOT [--episodes 2] [--frames 60]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from safetensors.numpy import load_file

JOINTS = 7
TASK = "follow the joint trajectory"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="fixtures/tiny_robot")
    parser.add_argument("out", type=Path, help="dataset root to create (must not exist, or is replaced)")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--frames", type=int, default=60, help="frames kept per episode")
    parser.add_argument("--repo-id", default="ckpt_tools/tiny_robot")
    args = parser.parse_args()

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cols = load_file(str(args.src / "data" / "frames.safetensors"))
    fps = 30
    names = [f"joint_{i}" for i in range(JOINTS)]
    features = {
        "observation.state": {"dtype": "float32", "shape": (JOINTS,), "names": names},
        "observation.environment_state": {"dtype": "float32", "shape": (JOINTS,), "names": names},
        "action": {"dtype": "float32", "shape": (JOINTS,), "names": names},
    }
    if args.out.exists():
        shutil.rmtree(args.out)
    ds = LeRobotDataset.create(args.repo_id, fps, features, root=args.out, use_videos=False)
    for ep in range(args.episodes):
        rows = (cols["episode_index"] == ep).nonzero()[0][: args.frames]
        for i in rows:
            state = cols["observation.state"][i]
            ds.add_frame(
                {
                    "observation.state": state[:JOINTS].copy(),
                    "observation.environment_state": state[JOINTS:].copy(),
                    "action": cols["action"][i].copy(),
                    "task": TASK,
                }
            )
        ds.save_episode()
    ds.finalize()
    print(f"wrote {args.out} ({args.episodes} episodes x {args.frames} frames)")


if __name__ == "__main__":
    main()
