"""Which machine this is, for files that several hosts see on shared storage.

A process id names a process only on its own host, and only until that host reboots: a lock or
a temporary file on shared storage must say which host (and which boot of it) its process ran
on before anyone may judge from the id whether that process is still alive.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

# Simulates distinct hosts on one machine (the multi-host tests); unset in real use.
HOST_ID_ENV = "CKPT_TOOLS_HOST_ID"


def host_identity() -> tuple[str, str]:
    """(host name, boot id): a host that rebooted has no process of before."""
    override = os.environ.get(HOST_ID_ENV)
    if override:
        return override, override
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def host_tag() -> str:
    """Eight hex digits naming this host and boot, short enough for a file name."""
    host, boot = host_identity()
    return hashlib.blake2b(f"{host}\0{boot}".encode(), digest_size=4).hexdigest()
