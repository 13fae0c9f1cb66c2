"""Which tests belong to the ``torchrun`` lane: found from the code, so a new test cannot forget its marker.

A test starts a training job (or torchrun) when its function, a helper function of the test
modules it calls, or any fixture it uses (directly or through another fixture) refers to one
of :data:`LAUNCHERS` - the launch helpers of ``devtools`` and ``tests/support``.
``tests/conftest.py`` marks every such test ``torchrun``. A launch this scan cannot see (say,
through a name imported inside a function) still fails in an unmarked test, at run time
(``devtools.procs.IN_PROCESS_ONLY_ENV``), so the fast lane never starts one by accident.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import CodeType, FunctionType
from typing import Any

import pytest

from devtools import procs, training
from devtools.reliability import crash_harness, fuzz_runner, restart_faults
from tests.support import dcp_fixtures

LAUNCHERS: tuple[Any, ...] = (
    training.train,
    training.train_command,
    training.start_train,
    training.train_multinode,
    procs.multinode_torchrun_commands,
    procs.torchrun_command,
    fuzz_runner.run_train_case,
    crash_harness,  # every trial of the crash harness is a torchrun job
    restart_faults,  # and every trial of the restart faults
    dcp_fixtures.write_checkpoints,
)
_LAUNCHER_IDS = frozenset(id(launcher) for launcher in LAUNCHERS)


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_objects(const)


def launches(func: Callable[..., Any], _seen: set[int] | None = None) -> bool:
    """Does ``func`` (or a helper function in ``tests`` that it calls) refer to a launcher?"""
    seen = set() if _seen is None else _seen
    func = inspect.unwrap(func)
    if not isinstance(func, FunctionType) or id(func) in seen:
        return False
    seen.add(id(func))
    for code in _code_objects(func.__code__):
        for name in code.co_names:
            target = func.__globals__.get(name)
            if id(target) in _LAUNCHER_IDS:
                return True
            if isinstance(target, FunctionType) and target.__module__.startswith("tests.") and launches(target, seen):
                return True
    return False


def starts_jobs(item: pytest.Item) -> bool:
    """Does this collected test, or a fixture in its closure, start a training job or torchrun?"""
    function = getattr(item, "function", None)
    if function is not None and launches(function):
        return True
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(launches(fixture.func) for defs in definitions for fixture in defs)
