"""``ckpt-train``: parse dotted flags, refuse bad set-ups, run training.

Every start-up refusal is one line naming the flag or variable, printed by rank 0 (all ranks
reach the same verdict; the others wait for the launcher to stop them), and a non-zero exit;
never a traceback.

    torchrun --nproc-per-node=2 $(which ckpt-train) --dataset.root=fixtures/tiny_robot \\
        --policy.type=act --parallelism.dp_shard=2 --output_dir=outputs/run --steps=20
    ckpt-train --resume=true --config_path=outputs/run/checkpoints/last/pretrained_model/train_config.json
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ckpt_tools.cli.untrusted import echo, printable
from ckpt_tools.errors import CkptError, ConfigError, ExitCode, PeerLost, WriteError
from ckpt_tools.train import import_heap
from ckpt_tools.train.env_guard import env_rank
from ckpt_tools.train.report.launcher import record_for_launcher

PEER_LOST_GRACE_S = 3.0
# What the `training` extra brings that every launch imports; a PEFT run also needs peft (the
# extra's accelerate is only ever imported by `accelerate launch` itself).
TRAINING_MODULES = ("torch", "draccus")
HELP_FLAGS = ("--help", "-h")

if TYPE_CHECKING:
    from ckpt_tools.train.checkpoint.load import LoadSource
    from ckpt_tools.train.config import TrainConfig


def main(argv: list[str] | None = None) -> None:
    """Run ckpt-train; the collector is paused over the imports (``import_heap``) and never left off."""
    import_heap.pause_collection()
    try:
        _main(argv)
    finally:
        import_heap.resume_collection()


def _main(argv: list[str] | None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    is_main = env_rank() == 0
    try:
        _require_training_extra(TRAINING_MODULES)
        if any(arg in HELP_FLAGS for arg in args):
            from ckpt_tools.train.help import render_help

            print(render_help(), end="")
            sys.exit(0)
        from ckpt_tools.train.env_guard import check_accelerate_env, check_launcher_env, check_restart_env
        from ckpt_tools.train.parsing import parse_train_args

        check_launcher_env(os.environ)
        check_restart_env(os.environ)
        acknowledged = check_accelerate_env(os.environ)
        dry_run = _dry_run(args)  # removes the flag: it is this launch's, never saved
        parsed = parse_train_args(args)
        cfg, resume_from = parsed.cfg, parsed.resume_from
        if cfg.peft is not None:
            _require_training_extra(("peft",))
        step = None
        if resume_from is not None:
            from ckpt_tools.train.checkpoint.load import preflight_resume

            # A 0.6.x checkpoint is named as such before anything else, then one whose parts disagree.
            step = preflight_resume(resume_from).step
        cfg.validate()
        load_source = _load_source(cfg) if resume_from is None else None
        if resume_from is not None:
            from ckpt_tools.format.layout import StepPaths
            from ckpt_tools.train.checkpoint.load import require_saved_settings

            require_saved_settings(StepPaths(resume_from), cfg.run_settings())
        done = _already_done(cfg, step) if resume_from is not None and step is not None else None
        notices = []
        if done is None and resume_from is not None and step is not None:
            notices = _resume_output(cfg, resume_from, step)
    except CkptError as e:
        _fail(e, is_main)
    if done is not None:
        if is_main:
            echo(done)
        sys.exit(0)  # before any process group: every rank reaches the same verdict and exits
    if acknowledged and is_main:
        echo(f"warning: accelerate engine variables acknowledged and ignored: {', '.join(acknowledged)}")
    for note in parsed.notes if is_main else ():
        echo(f"note: {note}")
    for notice in notices if is_main else []:
        echo(f"warning: {notice}")
    if load_source is not None and is_main:
        echo(f"note: this new run starts from {load_parts_line(load_source)}; the other parts start fresh")
    if dry_run:
        _dry_run_exit(cfg, resume_from, is_main)
    _run(cfg, resume_from, load_source)


def _load_source(cfg: TrainConfig) -> LoadSource | None:
    """``--checkpoint.load_from``: the checkpoint and the parts a new run starts from, checked (None: a fresh run)."""
    if not cfg.checkpoint.load_from:
        return None
    from ckpt_tools.train.checkpoint.load import preflight_load_source

    fp16 = cfg.accelerator.mixed_precision == "fp16"
    return preflight_load_source(cfg.checkpoint.load_from, cfg.checkpoint.load, cfg.run_settings(), fp16)


def load_parts_line(source: LoadSource) -> str:
    from ckpt_tools.facts.load_parts import initialized_from
    from ckpt_tools.format.rules.load_parts import describe

    return describe(initialized_from(source.paths, source.record, source.parts))


def _dry_run(args: list[str]) -> bool:
    """Pop ``--dry_run=true|false`` (bare ``--dry_run`` is true) from ``args``."""
    found = False
    for arg in list(args):
        name, _, value = arg.partition("=")
        if name == "--dry_run":
            args.remove(arg)
            if value.lower() not in ("", "true", "false"):
                raise ConfigError(f"--dry_run={value}: choose true or false")
            found = value.lower() != "false"
    return found


def _dry_run_exit(cfg: TrainConfig, resume_from: Path | None, is_main: bool) -> NoReturn:
    """Every check before the first step, without a process group; print them and exit (nothing written).

    The exit code is the one the launch would have ended with: 0, 2 for a setting, 3 for the checkpoint.
    """
    import torch

    from ckpt_tools.train.preflight import Launch, build_checks

    world = int(os.environ.get("WORLD_SIZE", "1"))
    launch = Launch(world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))), not torch.cuda.is_available())
    checks = build_checks(cfg, resume_from, launch)
    failed = next((c for c in checks if c.failed), None)
    if is_main:
        for check in checks:
            echo(f"  {check.status:<4}  {check.name:<14} {check.message}")
        if failed is None:
            what = f"resume from {resume_from}" if resume_from is not None else f"start a run in {cfg.output_dir}"
            if resume_from is None and cfg.checkpoint.load_from:
                what += f" from {cfg.checkpoint.load_from}"
            echo(f"dry run: every check passed; this launch would {what} (nothing was written)")
        else:
            echo(f"error: {failed.message}", err=True)
    code = 0 if failed is None else int(ExitCode.BAD_INPUT if failed.name == "load-plan" else ExitCode.USAGE)
    if failed is not None and is_main:
        record_for_launcher(printable(f"error: {failed.message}"), code)
    sys.exit(code)


def _require_training_extra(modules: tuple[str, ...]) -> None:
    """Refuse in one line, naming the extra, when a module it brings cannot be imported."""
    # Found, not imported: importing torch costs seconds of CPU, which a refused command line
    # (most of them are refused before any tensor exists) need not pay.
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
            problem = "" if found else "not installed"
        except (ImportError, ValueError) as e:
            found, problem = False, str(e)
        if not found:
            raise ConfigError(
                f"ckpt-train needs the `training` extra: {name} cannot be imported ({problem}); install CPU torch, then"
                " pip install -e '.[training]' in a checkout of ckpt_tools, or"
                " pip install 'ckpt-tools[training] @ git+<its repository URL>' (README: Set up and run)"
            ) from None


def _already_done(cfg: TrainConfig, step: int) -> str | None:
    """The line a resume of a run that already reached ``--steps`` ends with (None: there is work)."""
    from ckpt_tools.format.rules.resume_output import nothing_to_do

    return nothing_to_do(Path(str(cfg.output_dir)), step, cfg.steps)


def _resume_output(cfg: TrainConfig, resume_from: Path, step: int) -> list[str]:
    """Where the resume of ``step`` writes: refuse to save over newer checkpoints, say when it is another
    run; and whether its train_config.json was edited since the save (``verify-resume``'s warnings)."""
    from ckpt_tools.errors import ConfigError
    from ckpt_tools.format.layout import StepPaths
    from ckpt_tools.format.rules import save_files
    from ckpt_tools.format.rules.resume_output import check_output

    paths = StepPaths(resume_from)
    verdict = check_output(paths, step, Path(str(cfg.output_dir)), overwrite=cfg.overwrite_checkpoints)
    if verdict.refusal is not None:
        raise ConfigError(verdict.refusal)
    edit = save_files.config_edit(paths)
    return [*verdict.notices, *([edit] if edit is not None else [])]


def _run(cfg: TrainConfig, resume_from: Path | None, load_source: LoadSource | None = None) -> None:
    from ckpt_tools.train.loop import run_training
    from ckpt_tools.train.parallel.distributed import init_distributed, is_transport_failure, teardown
    from ckpt_tools.train.report import startup

    import_heap.freeze_startup_imports()
    startup.mark("imports")
    env = init_distributed(cfg.collective_timeout_s)
    startup.mark("process_group")
    try:
        run_training(cfg, env, resume_from, load_source)
    except WriteError as e:
        # Rank-local: each rank writes its own files, and may be the only one that failed.
        _fail(WriteError(f"rank {env.rank}: {e}") if env.distributed else e, True, collective_started=True)
    except CkptError as e:
        _fail(e, env.is_main, collective_started=True)
    except RuntimeError as e:  # DistError, or gloo's plain RuntimeError from inside FSDP hooks
        if not is_transport_failure(e):
            raise
        _peer_lost(e, env.rank)
    except KeyboardInterrupt:
        if env.is_main:
            echo("error: interrupted", err=True)
        os._exit(130)
    teardown(env)  # the collective finish: every rank is done before anything is published
    if env.is_main and cfg.policy is not None and cfg.policy.repo_id:
        from ckpt_tools.train.publish import publish_final

        try:
            url = publish_final(cfg)
        except CkptError as e:
            _fail(e, True)
        echo(f"published the final policy to {url}")


def _peer_lost(error: Exception, rank: int) -> NoReturn:
    """A collective failed: another rank died or stalled past ``--collective_timeout_s``.

    When a rank fails with its own error (a full disk, say), the others see only the broken
    connection; the launcher then stops them with SIGTERM within a moment. So a rank waits
    briefly and stays quiet if that happens, leaving the line that names the cause; if nothing
    stops it (the failed rank is stalled, not dead), it says what it saw.
    """
    _await_launcher_stop(int(ExitCode.PEER_LOST))
    first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    _fail(PeerLost(f"rank {rank}: a collective failed (a rank died or stalled; {first})"), True, True)


def _await_launcher_stop(code: int) -> None:
    """Wait up to the grace period for the launcher's SIGTERM, and exit quietly with ``code`` if it comes.

    The launcher stops every rank as soon as one exits with an error. A rank that has nothing
    to add to another rank's line (the same verdict, or only the broken connection it left)
    therefore waits a moment instead of exiting first, which would get the rank holding the
    real line killed before it printed it.
    """
    signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
    from ckpt_tools.train.stopping import sigterm_seen

    if sigterm_seen():  # it came already, while this rank sat in the collective: the launcher is stopping the job
        os._exit(code)
    deadline = time.monotonic() + PEER_LOST_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _fail(error: CkptError, is_main: bool, collective_started: bool = False) -> NoReturn:
    """Print the one line and exit with its code.

    Every rank usually reaches the same verdict; the main rank prints it. Another rank waits
    for the launcher to stop it, and prints the line itself (naming its rank) only if no stop
    comes, that is when the verdict was its own.
    """
    code = int(getattr(error, "exit_code", ExitCode.USAGE))
    line = f"error: rank {env_rank()}: {error}" if not is_main else f"error: {error}"
    if not is_main:  # only ranks other than 0 of a multi-process job
        _await_launcher_stop(code)
    echo(line, err=True)
    record_for_launcher(printable(line), code)
    sys.stdout.flush()
    sys.stderr.flush()
    if collective_started:
        # Other ranks may be blocked in a collective that will never complete: exit now rather
        # than wait for them in an orderly teardown (torchrun stops the rest of the job).
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
