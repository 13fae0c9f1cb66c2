"""Hostile strings and hostile numbers in real checkpoints, judged by what the user sees.

Every name and number a checkpoint holds is anyone's to write. The reader families of
:mod:`devtools.reliability.fuzz_mutations` judge the Python API; these judge the commands'
output (docs/reliability.md, "Strings from checkpoints" and "Exit codes"):

- ``hostile_strings``: control characters, bidi overrides, line separators, lone surrogates
  and lookalike verdicts put into a tensor name (safetensors header or DCP ``.metadata``), a
  safetensors ``__metadata__`` value, a JSON string or key, a file or directory name, the
  ``last`` link, and the directory the checkpoint lives in;
- ``hostile_numbers``: huge (past 64 bits, past Python's 4300-digit limit), negative,
  fractional, non-finite (``NaN``, ``Infinity``, ``1e400``) and wrongly typed values put into
  ``training_step.json`` and ``train_config.json`` (step, batch size, seed, steps, gradient
  accumulation, dp sizes, ...), any other JSON number, and safetensors shapes, data offsets and
  the header length.

Each case runs a seeded sample of the commands (:data:`COMMANDS`) as forked processes
(:mod:`devtools.reliability.fuzz_cli`) and requires: a documented exit code, no traceback, no
hang, one ``error:`` line on failure, human output free of raw control characters, ``--json``
that parses, and nothing changed outside the conversion's output directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.reliability.fuzz_cli import output_problems, run_cli

# Pieces of hostile strings: each is something a terminal obeys, an encoder refuses, or a fake verdict.
STRING_PARTS = (
    "\x1b[2K\r  ok  healthy",
    "\x1b]0;owned\x07",
    "\u202e",
    "\u2066",
    "\u2069",
    "\u202a",
    "\udc80",
    "\ud800",
    "\n",
    "\r",
    "\x00",
    "\x07",
    "\x08",
    "\x7f",
    "\x85",
    "\x9b31m",
    "\u2028",
    "\u2029",
    "\t",
    "\nerror: fake\n",
    "na\u00efve",
    "\U0001f600",
    "\\x1b",
    "%s{0}",
    "'\"",
)
CONTROL_PARTS = STRING_PARTS[:19]
NUMBER_TOKENS = (
    "-1",
    "0",
    "-0",
    "1.5",
    "0.5",
    "-2.5",
    "2147483648",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "-9223372036854775809",
    "1" + "0" * 100,
    "-1" + "0" * 100,
    "1" + "0" * 4000,
    "9" * 5000,  # past Python's int-from-string limit: json.loads itself refuses it
    "1e308",
    "1e400",
    "-1e400",
    "1e-320",
    "NaN",
    "Infinity",
    "-Infinity",
    "true",
    "false",
    "null",
    '"7"',
    "[]",
    "{}",
    "4.0",
)
# Numbers a reader computes with (named in the issue), by file; any other numeric leaf is fair game too.
NAMED_NUMBERS = {
    "training_state/training_step.json": (
        ("step",),
        ("batch_size",),
        ("dp_world_size",),
        ("grad_accum_steps",),
        ("num_processes",),
        ("samples_seen",),
        ("parallelism", "dp_replicate"),
        ("parallelism", "dp_shard"),
        ("topology", "dp_replicate"),
        ("topology", "dp_shard"),
        ("topology", "world_size"),
    ),
    "pretrained_model/train_config.json": (
        ("batch_size",),
        ("seed",),
        ("steps",),
        ("save_freq",),
        ("log_freq",),
        ("num_workers",),
        ("parallelism", "dp_replicate"),
        ("parallelism", "dp_shard"),
        ("accelerator", "gradient_accumulation", "steps"),
        ("optimizer", "lr"),
    ),
}
PLACEHOLDER = "__ckpt_fuzz_token__"
TARGET_FORMS = ("root", "step", "step", "pretrained_model", "training_state", "model_dcp")
# (argv template, --json): {target}, {out}, {nproc} are filled in per case.
COMMANDS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("inspect", "{target}", "--tensors"), False),
    (("inspect", "{target}", "--tensors", "--json"), True),
    (("verify-resume", "{target}"), False),
    (("verify-resume", "{target}", "--json"), True),
    (("reshard-plan", "{target}", "--nproc", "{nproc}"), False),
    (("reshard-plan", "{target}", "--nproc", "{nproc}", "--json"), True),
    (("convert-dcp", "{target}", "--dry-run"), False),
    (("convert-dcp", "{target}", "--output", "{out}/conv", "--quiet"), False),
    (("push", "{target}", "--repo-id", "alice/fuzz"), False),
)
COMMANDS_PER_CASE = 4


@dataclass
class HostileCase:
    """What one mutation did: for the report, and the path the commands should be pointed at."""

    family: str
    detail: str
    target: Path | None = None  # a file the mutation made the natural target (a safetensors file)


def hostile_string(rng: random.Random, *, file_name: bool = False) -> str:
    """Two to five pieces, at least one a control; for a file name, only what a name can hold."""
    parts = [p for p in STRING_PARTS if not file_name or ("\x00" not in p and "\ud800" not in p)]
    controls = [p for p in CONTROL_PARTS if p in parts]
    pieces = [rng.choice(controls)] + [rng.choice(parts) for _ in range(rng.randrange(1, 5))]
    rng.shuffle(pieces)
    return "".join(pieces)


def _file_name(text: str) -> bytes:
    """A name the file system takes: no slash, no NUL, at most 200 bytes (surrogates become raw bytes)."""
    raw = os.fsencode(text.replace("/", "_"))
    return raw.replace(b"\x00", b"_")[:200] or b"x"


# ----------------------------------------------------------------------------- safetensors headers


def read_st(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def write_st(path: Path, header_text: str, body: bytes, length: int | None = None) -> None:
    raw = header_text.encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + body)


def safetensors_files(step: Path) -> list[Path]:
    return sorted(p for p in step.rglob("*.safetensors") if p.is_file() and not p.is_symlink())


def _tensor_keys(header: dict[str, Any]) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


# ----------------------------------------------------------------------------- hostile strings


def hostile_strings(step: Path, rng: random.Random) -> HostileCase:
    """One hostile string where a checkpoint holds a name (see the module doc)."""
    site = rng.choice(
        ["tensor_name", "tensor_name", "st_metadata", "dcp_fqn", "json_string", "json_key", "file_name", "last_link"]
    )
    text = hostile_string(rng, file_name=site in ("file_name", "last_link"))
    files = safetensors_files(step)
    if site in ("tensor_name", "st_metadata") and files:
        path = rng.choice(files)
        header, body = read_st(path)
        keys = _tensor_keys(header)
        if site == "tensor_name" and keys:
            old = rng.choice(keys)
            header[text] = header.pop(old)
            detail = f"tensor {old} of {path.relative_to(step)} renamed"
        else:
            header.setdefault("__metadata__", {})[rng.choice(["format", text])] = text
            detail = f"__metadata__ of {path.relative_to(step)}"
        write_st(path, json.dumps(header), body)
        return HostileCase("hostile_strings", f"{detail} to {text!a}", path)
    if site == "dcp_fqn" and _dcp_dirs(step):
        dcp = rng.choice(_dcp_dirs(step))
        old = _rename_fqn(step / dcp, text, rng)
        return HostileCase("hostile_strings", f"{dcp} item {old} renamed to {text!a}")
    if site in ("json_string", "json_key"):
        rel = rng.choice(_json_files(step))
        doc = json.loads((step / rel).read_text())
        if site == "json_key" or not _leaves(doc, str):
            node = rng.choice(_containers(doc, dict) or [doc])
            node[text] = rng.choice([1, "x", None])
            where = "a new key"
        else:
            key_path = rng.choice(_leaves(doc, str))
            _set(doc, key_path, text)
            where = "/".join(map(str, key_path))
        (step / rel).write_text(json.dumps(doc, ensure_ascii=True))
        return HostileCase("hostile_strings", f"{rel} {where} := {text!a}")
    if site == "last_link":
        link = step.parent / "last"
        link.unlink(missing_ok=True)
        os.symlink(_file_name(text), os.fsencode(str(link)))
        return HostileCase("hostile_strings", f"last -> {text!a} (dangling)")
    where = rng.choice(["", "pretrained_model", "training_state", "..", *_dcp_dirs(step)])
    folder = (step / where).resolve() if where == ".." else step / where
    name = _file_name(text)
    full = os.path.join(os.fsencode(str(folder)), name)
    if rng.random() < 0.5:
        with open(full, "wb") as f:
            f.write(b"{}")
    else:
        os.mkdir(full)
    return HostileCase(
        "hostile_strings", f"{'file' if os.path.isfile(full) else 'dir'} {os.fsdecode(name)!a} in {where or 'step'}/"
    )


def _dcp_dirs(step: Path) -> list[str]:
    from devtools.reliability.fuzz_mutations import dcp_dirs

    return dcp_dirs(step)


def _rename_fqn(dcp_dir: Path, new: str, rng: random.Random) -> str:
    """Rename one item of a DCP ``.metadata`` (loaded with torch's own classes: the pristine file)."""
    from devtools.reliability.fuzz_mutations import load_torch_metadata, save_torch_metadata

    md = load_torch_metadata(dcp_dir)
    old = rng.choice(sorted(md.state_dict_metadata))
    md.state_dict_metadata[new] = md.state_dict_metadata.pop(old)
    for key in list(md.storage_data):
        if key.fqn == old:
            md.storage_data[type(key)(new, key.offset, key.index)] = md.storage_data.pop(key)
    planner = getattr(md, "planner_data", None)
    if isinstance(planner, dict) and old in planner:
        planner[new] = planner.pop(old)
    save_torch_metadata(dcp_dir, md)
    (dcp_dir / ".metadata.index").unlink(missing_ok=True)  # else it vouches for the old names
    return old


def _json_files(step: Path) -> list[str]:
    found = [str(p.relative_to(step)) for p in step.rglob("*.json") if p.is_file() and not p.is_symlink()]
    return sorted(found) or ["training_state/training_step.json"]


def _leaves(doc: Any, kind: type | tuple[type, ...], prefix: list[Any] | None = None) -> list[list[Any]]:
    prefix = prefix or []
    out: list[list[Any]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            out += _leaves(v, kind, [*prefix, k])
        elif isinstance(v, kind) and not isinstance(v, bool):
            out.append([*prefix, k])
    return out


def _containers(doc: Any, kind: type) -> list[Any]:
    out = [doc] if isinstance(doc, kind) else []
    values = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else ()
    for v in values:
        out += _containers(v, kind)
    return out


def _set(doc: Any, key_path: list[Any], value: Any) -> None:
    node = doc
    for k in key_path[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(k), (dict, list)):
            node[k] = {}
        node = node[k]
    node[key_path[-1]] = value


def _has(doc: Any, key_path: tuple[str, ...]) -> bool:
    node = doc
    for k in key_path:
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return True


# ----------------------------------------------------------------------------- hostile numbers


def hostile_numbers(step: Path, rng: random.Random) -> HostileCase:
    """One hostile number where a checkpoint holds a count, a size or an offset (see the module doc)."""
    token = rng.choice(NUMBER_TOKENS)
    site = rng.choice(["named", "named", "named", "any_json", "shape", "offsets", "header_length"])
    files = safetensors_files(step)
    if site in ("shape", "offsets", "header_length") and files:
        path = rng.choice(files)
        header, body = read_st(path)
        keys = _tensor_keys(header)
        if site == "header_length" or not keys:
            size = path.stat().st_size
            length = rng.choice([0, 1, 7, 2**63, 2**64 - 1, size, size - 8, size + 1, 2**32])
            write_st(path, json.dumps(header), body, length=length)
            return HostileCase("hostile_numbers", f"{path.relative_to(step)} header length := {length}", path)
        name = rng.choice(keys)
        field_name = "shape" if site == "shape" else "data_offsets"
        values = header[name][field_name]
        at = rng.randrange(len(values)) if values else 0
        if values:
            values[at] = PLACEHOLDER
        else:
            values.append(PLACEHOLDER)
        text = json.dumps(header).replace(json.dumps(PLACEHOLDER), token)
        write_st(path, text, body)
        return HostileCase(
            "hostile_numbers", f"{path.relative_to(step)} {name} {field_name}[{at}] := {token[:40]}", path
        )
    rel, key_path = _number_site(step, rng, named=site == "named")
    doc = json.loads((step / rel).read_text())
    _set(doc, key_path, PLACEHOLDER)
    (step / rel).write_text(json.dumps(doc, indent=1).replace(json.dumps(PLACEHOLDER), token))
    return HostileCase("hostile_numbers", f"{rel} {'/'.join(map(str, key_path))} := {token[:40]}")


def _number_site(step: Path, rng: random.Random, *, named: bool) -> tuple[str, list[Any]]:
    """A file and key path: one the readers compute with (``named``), or any number of any JSON file."""
    if named:
        rel = rng.choice([r for r in NAMED_NUMBERS if (step / r).is_file()] or ["training_state/training_step.json"])
        if (step / rel).is_file():
            doc = json.loads((step / rel).read_text())
            present = [k for k in NAMED_NUMBERS.get(rel, ()) if _has(doc, k)]
            # Mostly a field the file holds; sometimes one it lacks (a field of another schema).
            key = rng.choice(present) if present and rng.random() < 0.85 else rng.choice(NAMED_NUMBERS[rel])
            return rel, list(key)
    rel = rng.choice(_json_files(step))
    doc = json.loads((step / rel).read_text()) if (step / rel).is_file() else {}
    numbers = _leaves(doc, (int, float))
    return rel, rng.choice(numbers) if numbers else ["step"]


FAMILIES: dict[str, Callable[[Path, random.Random], HostileCase]] = {
    "hostile_strings": hostile_strings,
    "hostile_numbers": hostile_numbers,
}


# ----------------------------------------------------------------------------- one case


def run_hostile_case(seed: Any, family: str, rng_seed: int, workdir: Path, *, timeout: float = 60.0) -> Any:
    """Copy ``seed``'s step (under a hostile directory name, sometimes), mutate, run commands, judge."""
    from devtools.reliability.fuzz_runner import CaseResult, _force_rmtree, snapshot

    rng = random.Random(rng_seed)
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{family}-{rng_seed}-", dir=workdir))
    parent = _file_name(hostile_string(rng, file_name=True)) if rng.random() < 0.25 else b"ckpt"
    base = Path(os.fsdecode(os.path.join(os.fsencode(str(root)), parent)))
    step = base / "checkpoints" / "000004"
    try:
        shutil.copytree(seed.step_dir, step, symlinks=True)
        os.symlink("000004", step.parent / "last")
        (root / "out").mkdir()
        case = FAMILIES[family](step, rng)
        targets = {
            "root": step.parent,
            "step": step,
            "pretrained_model": step / "pretrained_model",
            "training_state": step / "training_state",
            "model_dcp": step / "pretrained_model/pytorch_model_fsdp_0",
        }
        form = rng.choice(TARGET_FORMS)
        target = case.target if case.target is not None and rng.random() < 0.5 else targets[form]
        label = "file" if target == case.target else form
        hostile_parent = parent != b"ckpt"
        result = CaseResult(
            seed.name, family, case.detail + (" (under a hostile directory)" if hostile_parent else ""), label
        )
        before = snapshot(root)
        nproc = str(rng.choice([1, 2, 3, 4, 8]))
        for template, json_out in rng.sample(COMMANDS, COMMANDS_PER_CASE):
            argv = [a.format(target=target, out=root / "out", nproc=nproc) for a in template]
            run = run_cli(argv, timeout=timeout, cwd=root)
            name = " ".join([template[0], *(a for a in template[2:] if a.startswith("--"))])
            result.readers[name] = {"status": _status(run.code), "code": run.code}
            problems = output_problems(run, json_out=json_out)
            result.violations += problems
            result.raw_outputs += [p for p in problems if "raw control" in p]
            result.bad_exits += [p for p in problems if "is not one of" in p]
            if run.code is None:
                result.child = "timeout"
        after = snapshot(root)
        for rel in sorted(set(before) | set(after)):
            if rel == "out" or rel.startswith("out/") or before.get(rel) == after.get(rel):
                continue
            bucket = result.files_lost if rel in before and rel not in after else result.files_replaced
            bucket.append(rel)
            result.violations.append(f"changed outside the output dir: {rel!a}")
        return result
    finally:
        _force_rmtree(root)


def _status(code: int | None) -> str:
    return "timeout" if code is None else "ok" if code == 0 else "error"
