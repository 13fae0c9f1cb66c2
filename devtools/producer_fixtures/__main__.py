"""Build fixtures/producers/<name>/: checkpoints written by other producers' own save code.

Each producer runs its real save path in a torchrun launch on this CPU-only machine (gloo), in a
scratch directory; only the checkpoint folder it wrote is then copied into the fixture, with a
README.md saying how it was made (producer, versions, command, sha256 of every file). Checkpoint
files are never altered.

    # torchtitan from PyPI, without its heavy dependencies (datasets, wandb, tensorboard...):
    pip install --no-deps --target /work/titan-site torchtitan==0.3.0 torchdata tyro \\
        docstring-parser shtab typeguard spmd_types==0.2.3 einops
    bin/make-producer-fixtures torchtitan --site /work/titan-site
    # PyPI's torch (the project's): PyTorch's DCP recipe layout {"app": {"model", "optim"}}
    bin/make-producer-fixtures dcp-tutorial
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OUT = REPO / "fixtures" / "producers"


@dataclass(frozen=True)
class Producer:
    name: str  # the fixture's directory under fixtures/producers/
    script: str  # the rank program in devtools/producer_fixtures/
    nproc: int
    folder: str  # what the program writes into its OUT and the fixture keeps
    summary: str


PRODUCERS = {
    "torchtitan": Producer(
        "torchtitan",
        "torchtitan_run.py",
        3,
        "checkpoint",
        "torchtitan's CheckpointManager (interval 2, 4 steps): `checkpoint/step-2/` is a full training"
        " checkpoint (the model's entries at the top level next to `optimizer`, `lr_scheduler`, `dataloader`"
        " and `train_state`), `checkpoint/step-4/` the model-only last step (`last_save_model_only`, the"
        " default). FSDP2 over 3 ranks, uneven row shards. The model is a tiny Llama-shaped module with"
        " torchtitan's llama3 parameter names, not its `Llama3Model`: `torchtitan.models` imports Triton"
        " kernels, which a CPU-only torch lacks; everything that decides what the checkpoint holds is torchtitan's.",
    ),
    "dcp-tutorial": Producer(
        "dcp_tutorial",
        "dcp_tutorial.py",
        2,
        "checkpoint",
        'PyTorch\'s DCP recipe: `dcp.save({"app": AppState(model, optimizer)})`, so `checkpoint/` holds'
        " `app.model.*` (4 weights) next to `app.optim.*` (Adam state and param_groups). FSDP2 over 2 ranks.",
    ),
}


def fail(msg: str) -> None:
    print(f"make-producer-fixtures: {msg}", file=sys.stderr)
    raise SystemExit(2)


def versions(python_path: str | None) -> dict[str, str]:
    code = (
        "import json, sys, importlib.metadata as m, torch\n"
        "out = {'torch': torch.__version__, 'python': '.'.join(map(str, sys.version_info[:3]))}\n"
        "for name in ('torchtitan', 'torchdata'):\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env(python_path), capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"cannot import torch: {proc.stderr.strip().splitlines()[-1:]}")
    import json

    return json.loads(proc.stdout)


def env(python_path: str | None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    if python_path:
        out["PYTHONPATH"] = python_path
    return out


def listing(root: Path) -> list[str]:
    rows = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "README.md":
            digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            rows.append(f"| `{p.relative_to(root)}` | {p.stat().st_size} | `{digest}` |")
    return rows


def readme(producer: Producer, info: dict[str, str], cmd: list[str], site: Path | None, root: Path) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    made_by = "torchtitan " + info["torchtitan"] + " (PyPI)" if "torchtitan" in info else "torch " + info["torch"]
    lines = [
        f"# fixtures/producers/{producer.name}",
        "",
        producer.summary,
        "",
        f"- written by: {made_by}; torch {info['torch']}"
        + (f", torchdata {info['torchdata']}" if "torchdata" in info else "")
        + f", Python {info['python']}; CPU only, gloo",
        f"- program: `devtools/producer_fixtures/{producer.script}` (its docstring says what it runs and why)",
        f"- made: {when}, by `bin/make-producer-fixtures {'torchtitan --site DIR' if site else producer.name}`",
    ]
    if site is not None:
        lines.append(
            "- torchtitan installed with `pip install --no-deps --target DIR torchtitan=="
            + info["torchtitan"]
            + " torchdata tyro"
            " docstring-parser shtab typeguard spmd_types==0.2.3 einops`"
        )
    lines += [
        "- patched: nothing",
        "",
        "Command (run in a scratch directory; its `" + producer.folder + "/` was copied here unchanged):",
        "",
        "```",
        shlex.join(cmd),
        "```",
        "",
        "Files (size in bytes, first 16 hex digits of sha256):",
        "",
        "| path | size | sha256 |",
        "|---|---|---|",
        *listing(root),
    ]
    return "\n".join(lines) + "\n"


def build(producer: Producer, site: Path | None) -> Path:
    python_path = str(site.resolve()) if site else None
    info = versions(python_path)
    if site is not None and "torchtitan" not in info:
        fail(f"--site {site}: torchtitan is not installed there")
    with tempfile.TemporaryDirectory(prefix=f"producer-{producer.name}-") as tmp:
        scratch = Path(tmp)
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={producer.nproc}"]
        cmd = [*launcher, str(HERE / producer.script), "OUT"]
        run = [*cmd[:-1], str(scratch / "out")]
        (scratch / "out").mkdir()
        proc = subprocess.run(run, env=env(python_path), cwd=scratch, capture_output=True, text=True, timeout=600)
        if not (scratch / "out" / "DONE").exists():
            fail(f"{producer.script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        final = OUT / producer.name
        shutil.rmtree(final, ignore_errors=True)
        final.mkdir(parents=True)
        shutil.copytree(scratch / "out" / producer.folder, final / producer.folder)
    shown = [
        "python",
        "-m",
        "torch.distributed.run",
        *cmd[3:-2],
        f"devtools/producer_fixtures/{producer.script}",
        "OUT",
    ]
    if python_path:
        shown = ["env", "PYTHONPATH=DIR", *shown]
    (final / "README.md").write_text(readme(producer, info, shown, site, final))
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("producer", choices=sorted(PRODUCERS))
    parser.add_argument("--site", type=Path, help="with torchtitan: the --target directory it was installed into")
    args = parser.parse_args()
    if args.producer == "torchtitan" and args.site is None:
        fail("torchtitan needs --site DIR (see --help for the install line)")
    final = build(PRODUCERS[args.producer], args.site if args.producer == "torchtitan" else None)
    size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
    print(f"{final} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
