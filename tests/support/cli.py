"""Run ``ckpt-tools ARGS`` inside the test process: the same Typer app, exit code and streams, no start-up.

:func:`devtools.procs.run_cli` starts a real process (seconds of interpreter start-up each);
that is what the few end-to-end tests per contract use - one error line on stderr and the
documented exit code, and no torch needed. Tests that check many refusals or reports call
:func:`invoke_cli` instead: the command runs through the same app and the same error
boundary (``handled``), and the result has the same fields (``returncode``, ``stdout``,
``stderr``), so the assertions do not change. An exception that would have been a traceback
is raised into the test, not swallowed.
"""

from __future__ import annotations

import importlib
import subprocess

from typer.testing import CliRunner

from ckpt_tools.cli.app import COMMAND_MODULES, app


def invoke_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``ckpt-tools ARGS`` through :data:`ckpt_tools.cli.app.app`, as a finished-process record."""
    for module in COMMAND_MODULES.values():
        importlib.import_module(module)
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(["ckpt-tools", *args], result.exit_code, result.stdout, result.stderr)
