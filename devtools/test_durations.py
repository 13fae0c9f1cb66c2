"""Record how long each test file takes, for the order the suite hands files to its workers.

The suite runs on two pytest-xdist workers, one file at a time each (``--dist loadfile``), in
the order the files are collected. A long file that comes last leaves the other worker idle
while it runs, so ``tests/conftest.py`` hands out the longest files first (longest processing
time first: the idle tail is at most the last, short, files). The lengths come from the last
measured run, kept in ``tests/durations.json``; regenerate it after adding or reshaping a
heavy file:

    python -m pytest -q --junitxml=/tmp/suite.xml
    python -m devtools.test_durations /tmp/suite.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from devtools.procs import REPO

DURATIONS = REPO / "tests" / "durations.json"


def file_seconds(junit_xml: Path) -> dict[str, float]:
    """Seconds per test file (its tests' setup + call + teardown) in a pytest JUnit report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is the dotted module path (plus a class name for tests in a class)
        parts = [p for p in module if not p[:1].isupper()]
        totals["/".join(parts) + ".py"] += float(case.get("time", "0"))
    return dict(totals)


def load() -> dict[str, float]:
    """The recorded seconds per test file (relative to the checkout), empty if none were recorded."""
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m devtools.test_durations SUITE.xml  (from pytest --junitxml=SUITE.xml)", file=sys.stderr)
        return 2
    seconds = file_seconds(Path(argv[0]))
    kept = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]) if s >= 1.0}
    DURATIONS.write_text(json.dumps(kept, indent=1) + "\n")
    print(f"{DURATIONS.relative_to(REPO)}: {len(kept)} files of 1 s or more, {sum(kept.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
