"""Differential harness: do the tools' verdicts equal what really happens?

``verify-resume`` and ``inspect`` make predictions about a checkpoint; this package measures
them against ground truth instead of against expected answers written by hand. Each case
copies a real checkpoint (the trainer's own, made once per campaign by running ``ckpt-train``,
or one of LeRobot's fixtures), damages it with one entry of :mod:`.mutations`, and then runs
the prediction *and* the thing predicted: the actual ``ckpt-train --resume=true`` in the
checkpoint's own topology, and the reference readers (safetensors, torch's DCP reader,
``torch.load(weights_only=True)``). :mod:`.runner` classifies the pair, :mod:`.report` counts.
"""
