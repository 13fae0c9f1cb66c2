"""Hand a launch's one error line to ``torchrun``, whose failure summary would otherwise hide it.

torchrun (torch's elastic agent) gives each worker a path in ``TORCHELASTIC_ERROR_FILE`` and,
when a worker fails, prints what it wrote there as the "Root Cause" of its summary; a worker
that wrote nothing gets ``error_file: <N/A>`` and a link, below a traceback of the launcher's
own. ckpt-train refuses bad set-ups with one line and a documented exit code, so it writes that
line (and the code, which torchrun's own exit status of 1 does not carry) in the format torch's
``ErrorHandler`` uses. Plain JSON: no torch import on the way out of a failed start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"


def record_for_launcher(line: str, exit_code: int) -> None:
    """Write ``line`` where torchrun looks for this worker's error (nothing outside torchrun)."""
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if not path:
        return
    summary = f"{line}\n(ckpt-train exit code {exit_code}: the launcher itself always exits 1)"
    data = {"message": {"message": line, "extraInfo": {"py_callstack": summary, "timestamp": str(int(time.time()))}}}
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump(data, out)
        os.replace(temporary, path)
    except OSError:  # the summary then falls back to torchrun's own text; the line is on stderr anyway
        with contextlib.suppress(OSError):
            os.unlink(temporary)
