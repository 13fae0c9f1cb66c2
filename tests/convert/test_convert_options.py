"""One ConvertOptions behind every front-end: ``convert-dcp``, ``lerobot-convert-dcp`` and the Python API
plan the same conversion from the same options, and refuse a bad one with the same line."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_tools.cli.lerobot_convert_dcp import convert_dcp_main
from ckpt_tools.convert import ConvertOptions, convert_dcp
from ckpt_tools.errors import ExitCode, UsageError
from tests.support.cli import invoke_cli
from tests.support.lerobot_fixtures import main_run

STEP = main_run("fsdp-dcp") / "checkpoints" / "000004"


def _lerobot(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            convert_dcp_main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def _plan(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "seconds"}


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The dry-run plan of one conversion (bf16, shards of 2KB, an output dir), asked four ways."""
    out = tmp_path_factory.mktemp("plans") / "exported"
    cli = invoke_cli(
        "convert-dcp", str(STEP), "--dtype", "bf16", "--max-shard-size", "2KB", "-o", str(out), "--dry-run", "--json"
    )
    assert cli.returncode == 0, cli.stderr
    argv = [f"--checkpoint_dir={STEP}", "--dtype=bf16", "--max_shard_size=2KB", f"--output={out}", "--dry_run=true"]
    code, lerobot, err = _lerobot([*argv, "--json=true"])
    assert code == 0, err
    options = ConvertOptions(output=out, dtype="bf16", max_shard_size="2KB", dry_run=True, progress=False)
    keywords = convert_dcp(STEP, output=out, dtype="bf16", max_shard_size="2KB", dry_run=True, progress=False)
    return {
        "convert-dcp": _plan(json.loads(cli.stdout)),
        "lerobot-convert-dcp": _plan(json.loads(lerobot)),
        "ConvertOptions": _plan(convert_dcp(STEP, options).to_dict()),
        "keywords": _plan(keywords.to_dict()),
    }


def test_every_front_end_plans_the_same_conversion(plans: dict[str, dict[str, Any]]) -> None:
    reference = plans["ConvertOptions"]
    assert reference["plan"]["dtype"] == "bfloat16" and len(reference["plan"]["files"]) > 2  # shards + index
    assert not Path(reference["plan"]["output_dir"]).exists()  # a dry run wrote nothing
    for front_end, plan in plans.items():
        assert plan == reference, front_end


BAD = [
    (ConvertOptions(dtype="int8"), ["--dtype=int8"], "--dtype must be one of"),
    (ConvertOptions(max_shard_size="lots"), ["--max_shard_size=lots"], "--max-shard-size: cannot parse"),
    (ConvertOptions(what="optimizer", ema=True), ["--what=optimizer", "--ema=true"], "--ema converts the EMA weights"),
    (ConvertOptions(ema=True, delete_dcp=True), ["--ema=true", "--delete_dcp=true"], "--ema with --delete-dcp"),
]


@pytest.mark.parametrize(("options", "flags", "message"), BAD, ids=["dtype", "shard-size", "ema-what", "ema-delete"])
def test_a_bad_option_is_one_line_from_checked_whichever_front_end(
    options: ConvertOptions, flags: list[str], message: str
) -> None:
    with pytest.raises(UsageError, match=message) as refused:
        options.checked()
    assert refused.value.exit_code == ExitCode.USAGE
    code, out, err = _lerobot([f"--checkpoint_dir={STEP}", *flags, "--dry_run=true"])  # never writes the fixture
    assert code == int(ExitCode.USAGE) and not out
    assert err.strip() == f"error: {refused.value}"  # the same line, and only it


def test_what_is_checked_once_for_the_api_too() -> None:
    with pytest.raises(UsageError, match="--what must be one of model, optimizer, got 'everything'"):
        convert_dcp(STEP, what="everything")
    with pytest.raises(TypeError):  # a misspelled option is a programming error, never silently ignored
        convert_dcp(STEP, dtypes="bf16")
