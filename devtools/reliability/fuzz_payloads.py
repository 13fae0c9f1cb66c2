"""Hostile bytes for the fuzz suite: pickles that reach for callables, nesting and reference bombs.

Every code-running payload does one observable thing: it creates (or would create) the
sentinel file whose path it is given. The fuzz runner asserts that file never appears, so a
payload that gets through is counted as code execution, not guessed at.

The pickles are written opcode by opcode where the pickler itself would refuse (a global
that does not exist under that name, ``posix.system`` on a machine that has ``os.system``),
so each one names exactly the (module, name) pair an attacker would.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import zipfile
from dataclasses import dataclass

PROTO2 = b"\x80\x02"


def _args(*args: object) -> bytes:
    """The opcodes that push ``args`` as one tuple (a standalone pickle without PROTO, memo and STOP)."""
    body = pickletools.optimize(pickle.dumps(args, protocol=2))
    assert body[:2] == PROTO2 and body[-1:] == b"."
    return body[2:-1]


def _items(*args: object) -> bytes:
    """The opcodes that push ``args`` one by one (for MARK-based opcodes such as OBJ)."""
    body = _args(*args)
    if body == b")":
        return b""
    if body[-1:] in (b"\x85", b"\x86", b"\x87"):
        return body[:-1]
    assert body[:1] == b"(" and body[-1:] == b"t"
    return body[1:-1]


def global_call(module: str, name: str, *args: object) -> bytes:
    """``module.name(*args)`` through GLOBAL + REDUCE (what ``__reduce__`` pickles produce)."""
    return PROTO2 + b"c" + f"{module}\n{name}\n".encode() + _args(*args) + b"R."


def stack_global_call(module: str, name: str, *args: object) -> bytes:
    """The protocol-4 form: STACK_GLOBAL, which the stock unpickler resolves through dotted names."""
    strings = b""
    for s in (module, name):
        raw = s.encode()
        strings += b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE
    return b"\x80\x04" + strings + b"\x93" + _args(*args) + b"R."


def inst_call(module: str, name: str, *args: str) -> bytes:
    """Protocol 0: MARK, string args, INST module name - instantiation without REDUCE."""
    body = b"("
    for a in args:
        body += b"V" + a.encode("raw_unicode_escape") + b"\n"
    return body + b"i" + f"{module}\n{name}\n".encode() + b"."


def obj_call(module: str, name: str, *args: object) -> bytes:
    """OBJ: MARK, the class, then its arguments."""
    return PROTO2 + b"(c" + f"{module}\n{name}\n".encode() + _items(*args) + b"o."


def ext_call(code: int) -> bytes:
    """EXT1: a global named through the copyreg extension registry."""
    return PROTO2 + b"\x82" + bytes([code]) + b")R."


@dataclass(frozen=True)
class CallablePayload:
    """One way a pickle could try to run code; ``build(sentinel)`` gives its bytes."""

    name: str
    kind: str  # global | stack_global | inst | obj | ext

    def build(self, sentinel: str) -> bytes:
        module, _, func = self.name.partition(":")
        touch = f"touch {sentinel}"
        pyopen = f"open({sentinel!r}, 'w').close()"
        args: tuple[object, ...] = {
            "os:system": (touch,),
            "posix:system": (touch,),
            "nt:system": (touch,),
            "builtins:eval": (pyopen,),
            "builtins:exec": (pyopen,),
            "__builtin__:eval": (pyopen,),
            "builtins:open": (sentinel, "w"),
            "io:open": (sentinel, "w"),
            "subprocess:Popen": (["touch", sentinel],),
            "subprocess:call": (["touch", sentinel],),
            "subprocess:check_output": (["touch", sentinel],),
            "os:popen": (touch,),
            "pty:spawn": (["touch", sentinel],),
            "timeit:timeit": (pyopen,),
            "runpy:_run_code": (pyopen, {}),
            "code:InteractiveInterpreter": (),
            "importlib:import_module": ("os",),
            "builtins:__import__": ("os",),
            "builtins:getattr": (0, "__class__"),
            "copyreg:_reconstructor": (object, object, None),
            "pathlib:Path.touch": (sentinel,),
            "pathlib:PosixPath.write_text": (sentinel, "x"),
            "shutil:rmtree": (sentinel,),
            "torch:load": (sentinel,),
            "torch.serialization:load": (sentinel,),
            "numpy.core.multiarray:_reconstruct": (object, (0,), b"b"),
            "torch.distributed.checkpoint.metadata:os.system": (touch,),
            "torch.distributed.checkpoint.metadata:Metadata.__init__.__globals__": (),
            "collections:OrderedDict.fromkeys": ([sentinel],),
            "operator:attrgetter": ("system",),
            "functools:partial": (print, sentinel),
            "ctypes:CDLL": (None,),
            "webbrowser:open": (f"file://{sentinel}",),
            "pdb:run": (pyopen,),
        }.get(self.name, (touch,))
        if self.kind == "stack_global":
            return stack_global_call(module, func, *args)
        if self.kind == "inst":
            return inst_call(module, func, *[a for a in args if isinstance(a, str)])
        if self.kind == "obj":
            return obj_call(module, func, *args)
        if self.kind == "ext":
            return ext_call(0x41)
        return global_call(module, func, *args)


CALLABLE_NAMES = (
    "os:system",
    "posix:system",
    "nt:system",
    "builtins:eval",
    "builtins:exec",
    "__builtin__:eval",
    "builtins:open",
    "io:open",
    "subprocess:Popen",
    "subprocess:call",
    "subprocess:check_output",
    "os:popen",
    "pty:spawn",
    "timeit:timeit",
    "runpy:_run_code",
    "code:InteractiveInterpreter",
    "importlib:import_module",
    "builtins:__import__",
    "builtins:getattr",
    "copyreg:_reconstructor",
    "pathlib:Path.touch",
    "pathlib:PosixPath.write_text",
    "shutil:rmtree",
    "torch:load",
    "torch.serialization:load",
    "numpy.core.multiarray:_reconstruct",
    "torch.distributed.checkpoint.metadata:os.system",
    "torch.distributed.checkpoint.metadata:Metadata.__init__.__globals__",
    "collections:OrderedDict.fromkeys",
    "operator:attrgetter",
    "functools:partial",
    "ctypes:CDLL",
    "webbrowser:open",
    "pdb:run",
)
CALLABLE_KINDS = ("global", "stack_global", "inst", "obj", "ext")


def allowed_looking_tricks(sentinel: str) -> list[bytes]:
    """Pickles built only from names an allowlist might plausibly accept, chained into a call.

    ``pathlib.Path(sentinel)`` followed by a REDUCE on its result, ``torch.Size`` applied to an
    iterable with side effects, BUILD with a slot state that tries to replace ``__class__`` or
    ``__setstate__``: none of them may create the sentinel.
    """
    path = PROTO2 + b"cpathlib\nPath\n" + _args(sentinel) + b"R"
    return [
        # Path(sentinel).touch via getattr on the result
        path + b"cbuiltins\ngetattr\n" + b"\x85" + b"R.",
        # call the result of Path(...) as if it were a function
        path + _args() + b"R.",
        # torch.Size(iterable) where the iterable is the result of a call to os.system
        PROTO2 + b"ctorch\nSize\n" + b"cos\nsystem\n" + _args(f"touch {sentinel}") + b"R\x85R.",
        # BUILD on an allowed stand-in with a slot state replacing __setstate__ by os.system, then BUILD again
        PROTO2
        + b"ctorch.distributed.checkpoint.metadata\nChunkStorageMetadata\n)\x81"
        + b"N}\x8c\x0c__setstate__cos\nsystem\ns\x86b"
        + pickle.dumps(f"touch {sentinel}", protocol=2)[2:-1]
        + b"b.",
        # __reduce_ex__ style copyreg.__newobj__ on os.system's class
        PROTO2 + b"ccopyreg\n__newobj__\n" + b"cos\nsystem\n\x85R.",
        # persistent id carrying the command (refused unless a persistent_load exists)
        PROTO2 + pickle.dumps(f"touch {sentinel}", protocol=2)[2:-1] + b"Q.",
    ]


# ----------------------------------------------------------------- bombs


def nesting_bomb(depth: int, kind: str = "list") -> bytes:
    """A pickle of containers nested ``depth`` deep (the C unpickler builds it iteratively)."""
    if kind == "list":
        return PROTO2 + b"(" * depth + b"l" * depth + b"."
    if kind == "tuple":
        return PROTO2 + b"(" * depth + b"t" * depth + b"."
    if kind == "dict":
        # {0: {0: {...}}}: EMPTY_DICT, key, ..., innermost EMPTY_DICT, then SETITEM all the way out
        return PROTO2 + (b"}K\x00") * depth + b"}" + b"s" * depth + b"."
    raise ValueError(kind)


def reference_bomb(levels: int, fanout: int) -> bytes:
    """A few hundred bytes that describe ``fanout ** levels`` leaves through shared references."""
    node: object = [0] * fanout
    for _ in range(levels - 1):
        node = [node] * fanout
    return pickle.dumps(node, protocol=2)


def json_nesting_bomb(depth: int) -> str:
    return "[" * depth + "]" * depth


def torch_save_archive(data_pkl: bytes, storage: bytes = b"\0" * 16, key: str = "0") -> bytes:
    """A torch.save-shaped zip (stored, uncompressed) whose ``data.pkl`` is ``data_pkl``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr(f"archive/data/{key}", storage)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def safetensors_bytes(header: dict[str, object], data: bytes = b"", declared_len: int | None = None) -> bytes:
    import json

    raw = json.dumps(header).encode()
    n = len(raw) if declared_len is None else declared_len
    return struct.pack("<Q", n) + raw + data


# ----------------------------------------------------------------- BUILD on shared objects


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _global(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


def _dict(items: dict[str, bytes]) -> bytes:
    """EMPTY_DICT, then SETITEMS of string keys and the opcodes of each value."""
    return b"}(" + b"".join(_unicode(k) + v for k, v in items.items()) + b"u"


@dataclass(frozen=True)
class BuildAttack:
    """A pickle whose BUILD (or SETITEM / APPEND) targets an object the load did not create.

    ``allowlist``: which reader's globals it names - ``metadata`` (``.metadata``), ``data``
    (a chunk's ``data.pkl``) or ``plain`` (a non-tensor item). ``body`` pushes nothing and
    leaves the stack as it found it, so it can also be spliced in front of a real pickle.
    """

    name: str
    allowlist: str
    body: bytes

    def alone(self) -> bytes:
        return PROTO2 + self.body + b"N."

    def before(self, pickle_bytes: bytes) -> bytes:
        """``body`` spliced after the PROTO opcode of a real (protocol 2+) pickle."""
        assert pickle_bytes[:1] == b"\x80"
        return pickle_bytes[:2] + self.body + pickle_bytes[2:]


_MD = "torch.distributed.checkpoint.metadata"


def _build(target: bytes, state: bytes) -> bytes:
    return target + state + b"b0"  # BUILD, then POP the target


def _slots(items: dict[str, bytes]) -> bytes:
    return b"N" + _dict(items) + b"\x86"  # (None, slotstate): setattr for each item


def build_attacks() -> list[BuildAttack]:
    """Every way we know for a pickle to change a long-lived object through an allowlisted name."""
    fresh_chunk = _global(_MD, "ChunkStorageMetadata") + b")\x81"  # NEWOBJ: created by this load
    size, odict = _global("torch", "Size"), _global("collections", "OrderedDict")
    int32 = _unicode("int32")
    return [
        BuildAttack(
            "dict state on a stand-in class", "metadata", _build(_global(_MD, "Metadata"), _dict({"FIELDS": b")"}))
        ),
        BuildAttack(
            "slot state on a stand-in class",
            "metadata",
            _build(_global(_MD, "ChunkStorageMetadata"), _slots({"__init__": size})),
        ),
        BuildAttack(
            "slot state on a function (__defaults__)",
            "metadata",
            _build(_global("torch.serialization", "_get_layout"), _slots({"__defaults__": _unicode("x") + b"\x85"})),
        ),
        BuildAttack(
            "dict state on the float32 stand-in",
            "metadata",
            _build(_global("torch", "float32"), _dict({"name": int32})),
        ),
        BuildAttack(
            "slot state on pathlib.PurePath",
            "metadata",
            _build(_global("pathlib", "PurePath"), _slots({"__truediv__": odict})),
        ),
        BuildAttack(
            "SETITEM on the float32 stand-in",
            "metadata",
            _global("torch", "float32") + _unicode("name") + int32 + b"s0",
        ),
        BuildAttack("APPEND on torch.Size", "metadata", size + b"K\x01a0"),
        BuildAttack(
            "unknown dunder field on a fresh stand-in", "metadata", _build(fresh_chunk, _dict({"__setstate__": size}))
        ),
        BuildAttack("slot state on a fresh stand-in", "metadata", _build(fresh_chunk, _slots({"offsets": b")"}))),
        BuildAttack("dict state on OrderedDict", "plain", _build(odict, _dict({"fromkeys": b"N"}))),
        BuildAttack(
            "dict state on the FloatStorage stand-in",
            "data",
            _build(_global("torch", "FloatStorage"), _dict({"dtype": int32})),
        ),
        BuildAttack(
            "dict state on the float32 dtype of data.pkl",
            "data",
            _build(_global("torch", "float32"), _dict({"name": int32})),
        ),
        BuildAttack(
            "slot state on _rebuild_tensor_v2 (__kwdefaults__)",
            "data",
            _build(_global("torch._utils", "_rebuild_tensor_v2"), _slots({"__kwdefaults__": b"}"})),
        ),
    ]


# ----------------------------------------------------------------- work that grows faster than the file


def list_bomb(levels: int) -> list[object]:
    """One list shared ``levels`` deep: ``2**levels`` leaves in a few bytes per level once pickled."""
    node: list[object] = [0, 0]
    for _ in range(levels - 1):
        node = [node, node]
    return node


def tuple_bomb_as_key(levels: int = 60) -> bytes:
    """A body (as :class:`BuildAttack` bodies are) that uses a 2**levels-leaf tuple as a dict key."""
    body = b"K\x00K\x00\x86q\x000"  # (0, 0) into memo 0
    for i in range(1, levels):
        body += b"h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"\x86q" + bytes([i]) + b"0"
    return body + b"}h" + bytes([levels - 1]) + b"K\x01s0"  # {bomb: 1}, popped


def join_bomb(text_bytes: int = 256 * 1024, parts: int = 200_000) -> bytes:
    """A body: ``pathlib.PurePath(s, s, ..., s)`` of one memoized string - a join of text * parts."""
    return _global("pathlib", "PurePath") + b"(" + _unicode("x" * text_bytes) + b"q\x00" + b"h\x00" * parts + b"tR0"


def call_args_bomb(items: int = 50_000, calls: int = 50_000) -> bytes:
    """A body: one memoized list of ``items`` references, passed to ``torch.Size`` ``calls`` times."""
    lst = b"(" + b"K\x00" * items + b"lq\x00"
    return lst + b"0" + (_global("torch", "Size") + b"h\x00\x85R0") * calls


def big_int_key(digits_bytes: int = 200_000, uses: int = 20_000) -> bytes:
    """A body: one memoized ``digits_bytes``-byte integer used as a dict key ``uses`` times."""
    big = b"\x8b" + struct.pack("<i", digits_bytes) + b"\x01" * digits_bytes + b"q\x00"  # LONG4
    return big + b"0}" + b"h\x00K\x01s" * uses + b"0"
