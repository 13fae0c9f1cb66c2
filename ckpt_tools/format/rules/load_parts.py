"""Starting a new run from some parts of a checkpoint (``--checkpoint.load_from`` + ``--checkpoint.load``).

Fine-tuning from a checkpoint usually wants its weights and nothing else: a fresh optimizer,
schedule, generators and data order, at step 0, in a new output directory. The parts are named
as the training core's save/load pairs name them (:mod:`ckpt_tools.train.checkpoint.parts`):
``model``, ``optimizer``, ``scheduler``, ``scaler``, ``rng``; ``all`` is a resume's set.

Defined once, torch-free, for the trainer (its start-up and its load) and ``verify-resume
--load`` (which judges a checkpoint for such a start): which names are valid, which files each
part reads (the manifest's containers, :func:`ckpt_tools.format.manifest.part_containers`), and
whether a checkpoint can give the parts chosen (:mod:`ckpt_tools.facts.load_parts` reads it). A
part not chosen is never read, so a checkpoint whose optimizer state is damaged still starts a
weights-only run, though it cannot be resumed.
"""

from __future__ import annotations

MODEL, OPTIMIZER, SCHEDULER, SCALER, RNG = "model", "optimizer", "scheduler", "scaler", "rng"
PART_NAMES = (MODEL, OPTIMIZER, SCHEDULER, SCALER, RNG)
ALL = "all"
DEFAULT = (MODEL,)  # --checkpoint.load_from without --checkpoint.load: weights only
LOAD_FLAG, LOAD_FROM_FLAG = "--checkpoint.load", "--checkpoint.load_from"


def parse(text: str | None) -> tuple[str, ...]:
    """The parts ``--checkpoint.load`` names, in :data:`PART_NAMES` order (None: the default, weights only).

    Raises :class:`ValueError` with the one line that refuses an unknown name or an empty list.
    """
    if text is None:
        return DEFAULT
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"{LOAD_FLAG}={text}: name at least one part ({valid_names()})")
    if ALL in names:
        return resume_set()
    unknown = [n for n in names if n not in PART_NAMES]
    if unknown:
        raise ValueError(f"{LOAD_FLAG}={text}: unknown part {', '.join(unknown)} (choose from {valid_names()})")
    return tuple(n for n in PART_NAMES if n in names)


def valid_names() -> str:
    return ", ".join((*PART_NAMES, ALL))


def resume_set() -> tuple[str, ...]:
    """What ``all`` means: every part a resume restores (the loss scaler only where the run has one)."""
    return PART_NAMES


def setting_problems(
    load_from: str | None, load: str | None, *, resume: bool, peft: bool, policy_path: str | None
) -> list[str]:
    """The start-up refusals of these flags, each one line naming the flag (the trainer and the tools alike)."""
    if load_from is None:
        return [f"{LOAD_FLAG}={load} needs {LOAD_FROM_FLAG}=PATH (the checkpoint to load it from)"] if load else []
    out = []
    try:
        parse(load)
    except ValueError as e:
        out.append(str(e))
    if resume:
        out.append(
            f"{LOAD_FROM_FLAG} starts a new run at step 0 from a checkpoint's parts; --resume=true continues"
            " its own: pass one of them"
        )
    if peft:
        out.append(
            f"{LOAD_FROM_FLAG} with --peft.*: a LoRA run's base comes from --policy.path, which reads a"
            f" checkpoint's weights too: pass --policy.path={load_from} instead"
        )
    elif policy_path:
        out.append(f"{LOAD_FROM_FLAG} and --policy.path both give the weights: pass one of them")
    return out


def describe(initialized: dict[str, object]) -> str:
    """One line for inspect, verify-resume and the start-up: where a run's weights came from."""
    parts = initialized.get("parts")
    names = ",".join(str(p) for p in parts) if isinstance(parts, list) else "?"
    save_id = initialized.get("save_id")
    saved = f", save {str(save_id)[:12]}" if save_id else ""
    return f"{initialized.get('path')} (step {initialized.get('step')}{saved}): {names}"
