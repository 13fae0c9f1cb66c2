"""The catalog of mutation families: realistic ways a checkpoint goes wrong, applied to a copy.

Where the reliability fuzzer already damages files (:mod:`devtools.reliability.fuzz_mutations`:
bit flips, truncation, swaps, the ``Arena`` and ``Mutation`` records) it is reused; the families
here add what a *differential* test needs: damage that leaves files readable but the
checkpoint wrong (a file from another save, counters of the wrong type, hyper-parameters or a
config that disagree), because that is where a prediction and the real resume can part.

Every step carries ``save_files.json`` (sizes and digests of what the save wrote), which
refuses most edits of state files outright. A family may *reseal* the step after its edit -
write the record anew over the damaged files, as a buggy or hostile writer would - so that
the deeper checks behind the record are exercised too; the detail line says when it did.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.differential.bases import Base
from devtools.reliability import fuzz_mutations as fm
from devtools.reliability.fuzz_mutations import Arena, Mutation

MODEL_ST = "pretrained_model/model.safetensors"
TRAIN_CONFIG = "pretrained_model/train_config.json"
TRAINING_STEP = "training_state/training_step.json"
SCHEDULER = "training_state/scheduler_state.json"
PARAM_GROUPS = "training_state/optimizer_param_groups.json"
OPTIMIZER_ST = "training_state/optimizer_state.safetensors"
RNG = "training_state/rng_state.safetensors"
SAVE_FILES = "training_state/save_files.json"


@dataclass
class Case:
    """One case's copy (``arena``) of its base's resume step, and where it came from."""

    arena: Arena
    base: Base

    @property
    def step(self) -> Path:
        return self.arena.step

    def exists(self, rel: str) -> bool:
        return (self.step / rel).exists()


Family = Callable[[Case, random.Random], Mutation]


# ----------------------------------------------------------------- helpers


def reseal(case: Case) -> bool:
    """Record the step's files as they are now (a new save id), as the trainer's commit would."""
    from ckpt_tools.format.layout import StepPaths
    from ckpt_tools.format.rules import save_files

    if not case.exists(SAVE_FILES):
        return False
    try:
        save_files.write_record(StepPaths(case.step))
    except (OSError, ValueError):
        return False
    return True


def maybe_reseal(case: Case, rng: random.Random, mutation: Mutation, chance: float = 0.5) -> Mutation:
    if rng.random() < chance and reseal(case):
        mutation.detail += " [resealed]"
    return mutation


def _json(case: Case, rel: str) -> Any:
    return json.loads((case.step / rel).read_text())


def _write_json(case: Case, rel: str, doc: Any) -> None:
    (case.step / rel).write_text(json.dumps(doc, indent=2, allow_nan=True))


def _leaf_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.extend(_leaf_paths(value, (*prefix, key)) if isinstance(value, dict) else [(*prefix, key)])
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key] if isinstance(node, list) else node.setdefault(key, {})
    node[path[-1]] = value


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: Any, data: bytes, text: bytes | None = None) -> None:
    body = json.dumps(header).encode() if text is None else text
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def safetensors_files(case: Case) -> list[str]:
    return [f for f in fm.files_of(case.step) if f.endswith(".safetensors")]


def _other_step(case: Case, rng: random.Random) -> tuple[str, Path] | None:
    """A neighbouring step of the same run, or the sibling run's same step."""
    options = [("neighbour step", case.base.later)]
    sibling = case.base.sibling_step()
    if sibling is not None:
        options.append(("another run", sibling))
    options = [(what, p) for what, p in options if p.is_dir() and p.resolve() != case.base.step_dir().resolve()]
    return rng.choice(options) if options else None


# ----------------------------------------------------------------- a file from another save

FOREIGN_PARTS = (
    MODEL_ST,
    "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp",
    "pretrained_model/pytorch_model_fsdp_0/__1_0.distcp",
    "pretrained_model/pytorch_model_fsdp_0",
    RNG,
    SCHEDULER,
    OPTIMIZER_ST,
    PARAM_GROUPS,
    "training_state/optimizer_0/__0_0.distcp",
    "training_state/optimizer_0/__1_0.distcp",
    "training_state/optimizer_0",
    TRAINING_STEP,
)


def foreign_file(case: Case, rng: random.Random) -> Mutation:
    """One file (or DCP directory) taken from a neighbouring step or another run of the same config."""
    source = _other_step(case, rng)
    if source is None:
        return byte_flip(case, rng)
    what, other = source
    parts = [p for p in FOREIGN_PARTS if (case.step / p).exists() and (other / p).exists()]
    rel = rng.choice(parts)
    dst = case.step / rel
    if dst.is_dir():
        shutil.rmtree(dst)
        shutil.copytree(other / rel, dst)
    else:
        shutil.copyfile(other / rel, dst)
    mutation = Mutation("foreign_file", f"{rel} from the {what} ({other.name})", [rel])
    return maybe_reseal(case, rng, mutation, 0.4)


# ----------------------------------------------------------------- state values

BAD_VALUES: tuple[Any, ...] = (0, -1, -4, "2", 2.5, None, math.nan, math.inf, True, 10**30, [])


def state_values(case: Case, rng: random.Random) -> Mutation:
    """A state file's field with the wrong type, NaN/inf, a zero or negative count; or an Adam step tensor so."""
    files = [f for f in (TRAINING_STEP, SCHEDULER, PARAM_GROUPS) if case.exists(f)]
    if case.exists(OPTIMIZER_ST) and rng.random() < 0.25:
        return _adam_step_value(case, rng)
    rel = rng.choice(files)
    doc = _json(case, rel)
    if rel == PARAM_GROUPS and isinstance(doc, list):  # a list of groups
        paths = [(0, *p) for p in _leaf_paths(doc[0])] if doc and isinstance(doc[0], dict) else []
        container: Any = doc
    else:
        paths, container = _leaf_paths(doc), doc
    if not paths:
        return byte_flip(case, rng)
    path = rng.choice(paths)
    value = rng.choice(BAD_VALUES)
    _set(container, path, value)
    _write_json(case, rel, container)
    mutation = Mutation("state_values", f"{rel} {'.'.join(map(str, path))} = {value!r}", [rel])
    return maybe_reseal(case, rng, mutation, 0.6)


def _adam_step_value(case: Case, rng: random.Random) -> Mutation:
    path = case.step / OPTIMIZER_ST
    header, data = read_safetensors(path)
    steps = [k for k, v in header.items() if k != "__metadata__" and k.endswith("step") and v.get("dtype") == "F32"]
    if not steps:
        return byte_flip(case, rng)
    key = rng.choice(steps)
    value = rng.choice([math.nan, math.inf, 0.0, -3.0, 1e9])
    start, end = header[key]["data_offsets"]
    count = (end - start) // 4
    buf = bytearray(data)
    buf[start:end] = struct.pack(f"<{count}f", *([value] * count))
    write_safetensors(path, header, bytes(buf))
    mutation = Mutation("state_values", f"{OPTIMIZER_ST} {key} = {value}", [OPTIMIZER_ST])
    return maybe_reseal(case, rng, mutation, 0.6)


# ----------------------------------------------------------------- hyper-parameters vs train_config.json

CONFIG_HPARAMS: tuple[tuple[tuple[str, ...], Callable[[Any], Any]], ...] = (
    (("optimizer", "lr"), lambda v: v * 10),
    (("optimizer", "lr"), lambda v: v / 100),
    (("optimizer", "weight_decay"), lambda v: 0.5),
    (("optimizer", "betas"), lambda v: [0.5, 0.9]),
    (("optimizer", "eps"), lambda v: 1e-3),
    (("optimizer", "grad_clip_norm"), lambda v: 0.01),
    (("scheduler", "type"), lambda v: "constant" if v != "constant" else "cosine"),
    (("scheduler", "warmup_steps"), lambda v: 3),
    (("scheduler", "min_lr_ratio"), lambda v: 0.9),
)


def hparams(case: Case, rng: random.Random) -> Mutation:
    """Optimizer / scheduler hyper-parameters that disagree between the saved state and train_config.json."""
    where = rng.choice(["config", "config", "param_groups", "scheduler"])
    if where == "param_groups" and case.exists(PARAM_GROUPS):
        doc = _json(case, PARAM_GROUPS)
        groups = doc if isinstance(doc, list) else doc.get("param_groups", [])
        keys = [k for k in ("lr", "weight_decay", "eps", "initial_lr", "betas") if groups and k in groups[0]]
        if keys:
            key = rng.choice(keys)
            value: Any = [0.5, 0.9] if key == "betas" else groups[0][key] * rng.choice([0.01, 10.0])
            for group in groups:
                group[key] = value
            _write_json(case, PARAM_GROUPS, doc)
            mutation = Mutation("hparams", f"{PARAM_GROUPS} {key} = {value!r} in every group", [PARAM_GROUPS])
            return maybe_reseal(case, rng, mutation, 0.6)
    if where == "scheduler" and case.exists(SCHEDULER):
        doc = _json(case, SCHEDULER)
        keys = [p for p in _leaf_paths(doc) if _numeric(_get(doc, p))]
        if keys:
            path = rng.choice(keys)
            old = _get(doc, path)
            new = [x * 10 for x in old] if isinstance(old, list) else old * 10 + 1
            _set(doc, path, new)
            _write_json(case, SCHEDULER, doc)
            mutation = Mutation("hparams", f"{SCHEDULER} {'.'.join(map(str, path))} {old!r} -> {new!r}", [SCHEDULER])
            return maybe_reseal(case, rng, mutation, 0.6)
    doc = _json(case, TRAIN_CONFIG)
    options = [(p, f) for p, f in CONFIG_HPARAMS if _has(doc, p)]
    if not options:
        return config_unbuildable(case, rng)
    path, change = rng.choice(options)
    old = _get(doc, path)
    new = change(old)
    _set(doc, path, new)
    _write_json(case, TRAIN_CONFIG, doc)
    return Mutation("hparams", f"{TRAIN_CONFIG} {'.'.join(path)} {old!r} -> {new!r}", [TRAIN_CONFIG])


def _has(doc: Any, path: tuple[Any, ...]) -> bool:
    try:
        _get(doc, path)
    except (KeyError, TypeError, IndexError):
        return False
    return True


# ----------------------------------------------------------------- a config the trainer cannot build

CONFIG_BREAKS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("policy", "n_heads"), 3),
    (("policy", "n_heads"), 5),
    (("policy", "n_heads"), 0),
    (("policy", "dim_model"), 30),
    (("policy", "dim_model"), 0),
    (("policy", "dim_model"), -32),
    (("policy", "dim_model"), "32"),
    (("policy", "dim_model"), 32.5),
    (("policy", "dim_feedforward"), -1),
    (("policy", "chunk_size"), 0),
    (("policy", "n_encoder_layers"), -1),
    (("policy", "n_obs_tokens"), None),
    (("policy", "state_dim"), 10),
    (("policy", "action_dim"), 6),
    (("policy", "dropout"), "high"),
    (("policy", "dropout"), 1.5),
    (("policy", "type"), "transformer9000"),
    (("batch_size",), 0),
    (("batch_size",), -8),
    (("batch_size",), "8"),
    (("seed",), "seed"),
    (("optimizer", "lr"), "fast"),
    (("optimizer", "lr"), -1.0),
    (("optimizer", "betas"), [0.9]),
    (("optimizer", "type"), "sgd9000"),
    (("scheduler", "type"), "zigzag"),
    (("parallelism", "dp_shard"), 3),
    (("parallelism", "dp_replicate"), 0),
    (("checkpoint_format",), "pickle"),
    (("accelerator", "mixed_precision"), "fp8"),
    (("accelerator", "gradient_accumulation", "steps"), 0),
    (("dataset", "root"), "/nonexistent/dataset"),
    (("dataset",), None),
    (("policy",), []),
)


def config_unbuildable(case: Case, rng: random.Random) -> Mutation:
    """A train_config.json value the trainer cannot build from: impossible dims, wrong types, unknown names."""
    if not case.exists(TRAIN_CONFIG):
        return byte_flip(case, rng)
    doc = _json(case, TRAIN_CONFIG)
    variant = rng.random()
    if variant < 0.1 and doc:
        key = rng.choice(sorted(doc))
        del doc[key]
        detail = f"top-level key {key!r} removed"
    elif variant < 0.15:
        doc = [doc]
        detail = "document wrapped in a list"
    else:
        path, value = rng.choice(CONFIG_BREAKS)
        _set(doc, path, value)
        detail = f"{'.'.join(path)} = {value!r}"
    _write_json(case, TRAIN_CONFIG, doc)
    return Mutation("config_unbuildable", f"{TRAIN_CONFIG} {detail}", [TRAIN_CONFIG])


# ----------------------------------------------------------------- a resume into a dir holding later steps


def later_steps(case: Case, rng: random.Random) -> Mutation:
    """The output dir holds step dirs after the resumed one: complete, partial, empty, or named oddly."""
    checkpoints = case.arena.checkpoints
    later = case.base.later
    variant = rng.choice(["complete", "complete_last", "two_later", "partial", "empty_dir", "file", "renamed"])
    detail = variant
    if variant in ("complete", "complete_last", "two_later"):
        shutil.copytree(later, checkpoints / later.name, symlinks=True)
        if variant == "complete_last":
            (checkpoints / "last").unlink()
            (checkpoints / "last").symlink_to(later.name)
        if variant == "two_later":
            shutil.copytree(later, checkpoints / f"{int(later.name) + 2:06d}", symlinks=True)
        detail = f"{variant}: {later.name} copied in"
    elif variant == "partial":
        shutil.copytree(later, checkpoints / f".{later.name}.partial", symlinks=True)
        detail = f"partial: .{later.name}.partial (a cut-off save)"
    elif variant == "empty_dir":
        (checkpoints / later.name).mkdir()
        detail = f"empty dir {later.name}"
    elif variant == "file":
        (checkpoints / later.name).write_text("not a step\n")
        detail = f"a plain file named {later.name}"
    else:
        name = f"{int(case.base.step) + 1:06d}"
        shutil.copytree(later, checkpoints / name, symlinks=True)
        detail = f"renamed: {later.name} copied in as {name}"
    return Mutation("later_steps", detail, [""])


# ----------------------------------------------------------------- the dataset


def dataset_meta(case: Case, rng: random.Random) -> Mutation:
    """A copy of the dataset (train_config.json points at it) whose meta/info.json is missing or disagrees."""
    if not case.exists(TRAIN_CONFIG):
        return byte_flip(case, rng)
    config = _json(case, TRAIN_CONFIG)
    root = (config.get("dataset") or {}).get("root") if isinstance(config, dict) else None
    if not root or not Path(root).is_dir():
        return config_unbuildable(case, rng)
    copy = case.arena.root / "dataset"
    shutil.copytree(root, copy)
    config["dataset"]["root"] = str(copy)
    _write_json(case, TRAIN_CONFIG, config)
    info_path = copy / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    features = info.get("features", {})
    variant = rng.choice(
        [
            "info_missing",
            "info_unparsable",
            "state_dim",
            "action_dim",
            "action_missing",
            "state_renamed",
            "dtype",
            "shape_type",
            "features_list",
            "total_frames",
            "fps_zero",
            "stats_missing",
            "frames_missing",
        ]
    )
    state = "observation.state" if "observation.state" in features else next(iter(features), "")
    if variant == "info_missing":
        info_path.unlink()
    elif variant == "info_unparsable":
        info_path.write_text(info_path.read_text()[:-20])
    elif variant == "stats_missing":
        (copy / "meta" / "stats.json").unlink(missing_ok=True)
    elif variant == "frames_missing":
        for data in (copy / "data").rglob("*"):
            if data.is_file():
                data.unlink()
    else:
        if variant == "state_dim" and state:
            features[state]["shape"] = [features[state]["shape"][0] - 4]
        elif variant == "action_dim" and "action" in features:
            features["action"]["shape"] = [features["action"]["shape"][0] + 1]
        elif variant == "action_missing":
            features.pop("action", None)
        elif variant == "state_renamed" and state:
            features["observation.joints"] = features.pop(state)
        elif variant == "dtype" and state:
            features[state]["dtype"] = rng.choice(["float64", "int8", "string"])
        elif variant == "shape_type" and state:
            features[state]["shape"] = rng.choice(["14", None, [-14], [14.0]])
        elif variant == "features_list":
            info["features"] = list(features)
        elif variant == "total_frames":
            info["total_frames"] = rng.choice([0, -1, 30000, "3000"])
        elif variant == "fps_zero":
            info["fps"] = rng.choice([0, -30, None])
        info_path.write_text(json.dumps(info, indent=2))
    return Mutation("dataset_meta", f"dataset copy: {variant}", [TRAIN_CONFIG])


# ----------------------------------------------------------------- safetensors headers


def safetensors_header(case: Case, rng: random.Random) -> Mutation:
    """Header edits: non-string metadata values, unparsable JSON, dtypes/shapes/names changed, a wrong index."""
    files = safetensors_files(case)
    variant = rng.choice(
        [
            "metadata_int",
            "metadata_nested",
            "metadata_null",
            "metadata_list",
            "unparsable",
            "not_utf8",
            "length_short",
            "dtype_same_size",
            "shape_permuted",
            "key_renamed",
            "key_dropped",
            "offsets_overlap",
            "index_json",
        ]
    )
    if variant == "index_json" or not files:
        return _index_json(case, rng)
    rel = rng.choice(files)
    path = case.step / rel
    header, data = read_safetensors(path)
    names = sorted(k for k in header if k != "__metadata__")
    name = rng.choice(names) if names else ""
    text: bytes | None = None
    meta = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    detail = variant
    if variant.startswith("metadata_"):
        key = rng.choice(sorted(meta)) if meta and rng.random() < 0.7 else "format"
        value = {"metadata_int": 7, "metadata_nested": {"a": "b"}, "metadata_null": None, "metadata_list": ["pt"]}[
            variant
        ]
        header["__metadata__"] = {**meta, key: value}
        detail = f"__metadata__.{key} = {value!r}"
    elif variant == "unparsable":
        body = json.dumps(header).encode()
        cut = rng.randrange(1, len(body))
        text = body[:cut] + b" " * (len(body) - cut)  # same length: only the JSON breaks
        detail = f"header JSON cut at byte {cut} (padded with spaces)"
    elif variant == "not_utf8":
        body = json.dumps(header).encode()
        pos = rng.randrange(len(body))
        text = body[:pos] + b"\xff" + body[pos + 1 :]
        detail = f"byte {pos} of the header := 0xff"
    elif variant == "length_short":
        body = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(body) - 3) + body + data)
        return maybe_reseal(case, rng, Mutation("safetensors_header", f"{rel} header length 3 short", [rel]), 0.5)
    elif variant == "dtype_same_size" and name:
        old = header[name]["dtype"]
        header[name]["dtype"] = {"F32": "I32", "I64": "F64", "F64": "I64", "I32": "F32", "U8": "I8"}.get(old, "U8")
        detail = f"{name} dtype {old} -> {header[name]['dtype']}"
    elif variant == "shape_permuted" and name:
        shape = header[name]["shape"]
        header[name]["shape"] = list(reversed(shape)) if len(shape) > 1 and shape[0] != shape[-1] else [1, *shape]
        detail = f"{name} shape {shape} -> {header[name]['shape']}"
    elif variant == "key_renamed" and name:
        header[name + ".renamed"] = header.pop(name)
        detail = f"{name} renamed"
    elif variant == "key_dropped" and name:
        header.pop(name)
        detail = f"{name} dropped from the header"
    elif variant == "offsets_overlap" and len(names) > 1:
        a, b = rng.sample(names, 2)
        header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
        detail = f"data_offsets of {a} and {b} exchanged"
    else:
        return _index_json(case, rng)
    write_safetensors(path, header, data, text)
    return maybe_reseal(case, rng, Mutation("safetensors_header", f"{rel} {detail}", [rel]), 0.5)


def _index_json(case: Case, rng: random.Random) -> Mutation:
    """A ``model.safetensors.index.json`` beside the weights that does not match the files."""
    rel = "pretrained_model/model.safetensors.index.json"
    names: list[str] = []
    if case.exists(MODEL_ST):
        header, _ = read_safetensors(case.step / MODEL_ST)
        names = sorted(k for k in header if k != "__metadata__")
    variant = rng.choice(["missing_file", "extra_name", "dropped_name", "not_json"])
    weight_map = dict.fromkeys(names, "model.safetensors")
    if variant == "missing_file" or not names:
        weight_map = dict.fromkeys(names or ["model.x"], "model-00001-of-00002.safetensors")
    elif variant == "extra_name":
        weight_map["model.not_a_tensor"] = "model.safetensors"
    elif variant == "dropped_name":
        weight_map.pop(rng.choice(names))
    text = (
        "{not json" if variant == "not_json" else json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map})
    )
    (case.step / rel).write_text(text)
    return Mutation("safetensors_header", f"{rel} added: {variant}", [rel])


# ----------------------------------------------------------------- bytes, values, swaps


def byte_flip(case: Case, rng: random.Random) -> Mutation:
    """1-8 random bits flipped anywhere in one file of the step."""
    files = [f for f in fm.files_of(case.step) if f != SAVE_FILES]
    rel = rng.choice(files)
    path = case.step / rel
    flipped = fm.flip_bits(path, 0, path.stat().st_size, rng, rng.choice([1, 1, 2, 8]))
    return maybe_reseal(case, rng, Mutation("byte_flip", f"{rel} bits at {flipped}", [rel]), 0.3)


def value_edit(case: Case, rng: random.Random) -> Mutation:
    """Tensor values rewritten in place (header untouched): NaN, inf, zeros, a scale, a sign."""
    files = safetensors_files(case)
    if not files:
        return byte_flip(case, rng)
    rel = rng.choice(files)
    path = case.step / rel
    header, data = read_safetensors(path)
    names = [k for k, v in header.items() if k != "__metadata__" and v["data_offsets"][1] > v["data_offsets"][0]]
    floats = [k for k in names if header[k]["dtype"] == "F32"]
    if not names:
        return byte_flip(case, rng)
    name = rng.choice(floats or names)
    start, end = header[name]["data_offsets"]
    buf = bytearray(data)
    how = rng.choice(["nan", "inf", "zero", "scale", "negate"]) if name in floats else "zero"
    if how == "zero":
        buf[start:end] = bytes(end - start)
    else:
        count = (end - start) // 4
        values = list(struct.unpack_from(f"<{count}f", buf, start))
        at = rng.randrange(count)
        if how == "nan":
            values[at] = math.nan
        elif how == "inf":
            values[at] = -math.inf
        elif how == "scale":
            values = [v * 1.5 for v in values]
        else:
            values = [-v for v in values]
        struct.pack_into(f"<{count}f", buf, start, *values)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - len(data)] + bytes(buf))
    return maybe_reseal(case, rng, Mutation("value_edit", f"{rel} {name} := {how}", [rel]), 0.5)


def file_swap(case: Case, rng: random.Random) -> Mutation:
    """Two files of the step exchanged: any two, or two of the same kind (shards, safetensors)."""
    kinds = {
        "shards": [f for f in fm.files_of(case.step) if f.endswith(".distcp")],
        "safetensors": safetensors_files(case),
        "json": [f for f in fm.files_of(case.step) if f.endswith(".json") and f != SAVE_FILES],
    }
    kind = rng.choice([k for k, v in kinds.items() if len(v) > 1] + ["any"])
    if kind == "any":
        mutation = fm.swap_files(case.arena, rng)
        mutation.family = "file_swap"
        return maybe_reseal(case, rng, mutation, 0.3)
    pool = kinds[kind]
    if kind == "shards":  # two shards of one DCP dir
        folder = rng.choice(sorted({f.rpartition("/")[0] for f in pool}))
        pool = (
            [f for f in pool if f.startswith(folder + "/")]
            if len([f for f in pool if f.startswith(folder)]) > 1
            else pool
        )
    a, b = rng.sample(pool, 2)
    pa, pb = case.step / a, case.step / b
    da, db = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(db)
    pb.write_bytes(da)
    return maybe_reseal(case, rng, Mutation("file_swap", f"{a} <-> {b}", [a, b]), 0.3)


def truncate(case: Case, rng: random.Random) -> Mutation:
    """A file cut short (the fuzzer's family)."""
    mutation = fm.truncate(case.arena, rng)
    return maybe_reseal(case, rng, mutation, 0.3)


FAMILIES: dict[str, Family] = {
    "foreign_file": foreign_file,
    "state_values": state_values,
    "hparams": hparams,
    "config_unbuildable": config_unbuildable,
    "later_steps": later_steps,
    "dataset_meta": dataset_meta,
    "safetensors_header": safetensors_header,
    "byte_flip": byte_flip,
    "value_edit": value_edit,
    "file_swap": file_swap,
    "truncate": truncate,
}

# Families that make sense on a LeRobot fixture (no ckpt-train resume to compare: inspect only,
# plus verify's answer for the record). The others need this trainer's config and dataset.
LEROBOT_FAMILIES = (
    "foreign_file",
    "state_values",
    "safetensors_header",
    "byte_flip",
    "value_edit",
    "file_swap",
    "truncate",
)


def _numeric(value: Any) -> bool:
    """A number, or a list of numbers (``lr_lambdas`` is a list of nulls: nothing to scale)."""
    if isinstance(value, list):
        return bool(value) and all(_numeric(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)
