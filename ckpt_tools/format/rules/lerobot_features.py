"""Whether a LeRobot dataset still fits the policy a LeRobot checkpoint holds, as ``lerobot-train --resume=true`` needs.

On resume LeRobot (0.6.1 and main alike) parses the checkpoint's ``train_config.json``, whose
``policy`` section holds the ``input_features`` / ``output_features`` the policy was built with
(``config.json`` is the same section), loads the dataset's ``meta/info.json`` into
``LeRobotDatasetMetadata`` and calls ``make_policy(cfg.policy, ds_meta=...)``
(``src/lerobot/policies/factory.py``). It compares no state or action shapes itself ("TODO:
add a check_state(cfg, features) and check_action(cfg, features)"), but this is what its steps do
with a dataset that no longer fits:

- ``utils/feature_utils.py`` ``dataset_to_policy_features`` types every dataset feature: ``image``
  / ``video`` dtypes are VISUAL and must be 3-D (``ValueError: Number of dimensions of <key> != 3``),
  turned from ``(h, w, c)`` to ``(c, h, w)`` when ``names[2]`` is ``channel(s)``;
  ``observation.environment_state`` is ENV, other ``observation*`` keys STATE, ``action*`` ACTION,
  the rest (``timestamp``, ``index``, ...) is dropped. ``rename_map`` renames the keys first.
- ``make_policy`` replaces ``output_features`` with the dataset's ACTION features: a missing or
  reshaped ``action`` builds another policy, and the saved weights no longer load into it
  (``from_pretrained``'s ``load_state_dict`` size mismatch, or the DCP load; without ``action``
  ACT fails building it on ``action_feature.shape``).
- It keeps the saved ``input_features``: a policy input the dataset lacks stops the run, in
  ``validate_visual_features_consistency`` (``policies/utils.py``: "Feature mismatch between
  dataset/environment and policy config", when neither camera set holds the other) or at the
  first batch (``KeyError`` in the policy's forward); a STATE/ENV input of another shape meets the
  checkpoint's normalizer statistics and input projection, which have the saved width.

Not failures: a dataset feature the policy does not use, an ACTION feature other than the saved
ones, and another image size (LeRobot compares no visual shapes; ACT's backbone takes any size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ACTION = "action"
OBS = "observation"
OBS_ENV_STATE = "observation.environment_state"


def policy_type(key: str, feature: Mapping[str, Any]) -> str | None:
    """``dataset_to_policy_features``' type for one dataset feature (None: the policy never sees it)."""
    if feature.get("dtype") in ("image", "video"):
        return "VISUAL"
    if key == OBS_ENV_STATE:
        return "ENV"
    if key.startswith(OBS):
        return "STATE"
    return "ACTION" if key.startswith(ACTION) else None


def policy_shape(feature: Mapping[str, Any]) -> tuple[Any, ...] | str:
    """The shape the policy sees for a dataset feature, or why LeRobot cannot read it."""
    shape = feature.get("shape")
    if not isinstance(shape, list):
        return f"shape {shape!r} is not a list"
    if feature.get("dtype") not in ("image", "video"):
        return tuple(shape)
    if len(shape) != 3:
        return f"Number of dimensions != 3 (shape={shape})"
    names = feature.get("names")
    if not isinstance(names, list) or len(names) < 3:
        return f"names {names!r}: LeRobot reads names[2] of an image feature"
    return (shape[2], shape[0], shape[1]) if names[2] in ("channel", "channels") else tuple(shape)


def feature_problems(
    policy: Mapping[str, Any], features: Mapping[str, Any], rename_map: Mapping[str, str] | None = None
) -> list[str]:
    """Why LeRobot's resume of ``policy`` (a saved policy config) fails on a dataset with ``features``.

    ``features`` is ``meta/info.json``'s ``features``; ``rename_map`` the run's recorded one.
    One line per problem; empty when the dataset fits.
    """
    seen: dict[str, tuple[str, tuple[Any, ...]]] = {}
    out = []
    for key, feature in features.items():
        if not isinstance(feature, Mapping) or "dtype" not in feature or "shape" not in feature:
            out.append(f"{key}: no dtype and shape - LeRobot cannot type the dataset's features")
            continue
        kind, shape = policy_type(key, feature), policy_shape(feature)
        if kind is None:
            continue
        if isinstance(shape, str):
            out.append(f"{key}: {shape} - dataset_to_policy_features refuses it")
            continue
        seen[(rename_map or {}).get(key, key)] = (kind, shape)
    saved_visual = {k for k, f in _features(policy, "input_features").items() if f.get("type") == "VISUAL"}
    given_visual = {k for k, (kind, _) in seen.items() if kind == "VISUAL"}
    refused = not rename_map and not (saved_visual <= given_visual or given_visual <= saved_visual)
    for group in ("input_features", "output_features"):
        for key, saved in _features(policy, group).items():
            want = tuple(saved.get("shape") or ())
            kind, shape = seen.get(key, (None, ()))
            role = "output" if group == "output_features" else "input"
            if kind is None or (saved.get("type") == "VISUAL") != (kind == "VISUAL"):
                why = (
                    "make_policy takes the policy's outputs from the dataset and cannot rebuild this policy"
                    if role == "output"
                    else "make_policy refuses it (Feature mismatch between dataset/environment and policy config)"
                    if refused and saved.get("type") == "VISUAL"
                    else "the first batch lacks it (KeyError in the policy's forward)"
                )
                where = "not in the dataset" if kind is None else f"a {kind} feature in the dataset"
                out.append(f"{key}: the policy's {role} feature {list(want)} is {where} - {why}")
            elif kind != "VISUAL" and shape != want:
                why = (
                    "the saved weights do not fit the policy make_policy builds from it"
                    if role == "output"
                    else ("the checkpoint's normalizer statistics and input layer have the saved width")
                )
                out.append(f"{key}: the dataset's shape {list(shape)}, the policy's {list(want)} - {why}")
    return out


def _features(policy: Mapping[str, Any], group: str) -> dict[str, Mapping[str, Any]]:
    value = policy.get(group)
    return {k: v for k, v in value.items() if isinstance(v, Mapping)} if isinstance(value, Mapping) else {}
