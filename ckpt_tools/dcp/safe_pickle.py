"""A pickle loader that builds only what we allow, changes nothing it did not create, and is bounded.

``pickle.load`` runs whatever callable a file names, so a hostile ``.metadata`` could execute
code on the machine of whoever inspects it. An allowlist of globals is not enough on its own:
the globals it hands out (stand-in classes, small functions, dtype stand-ins) live as long as
the process, and pickle's ``BUILD`` opcode rewrites whatever object is on its stack - a dict
state goes into ``obj.__dict__`` (frozen dataclasses included), a ``(None, slotstate)`` state
is ``setattr`` (on a class, a function's ``__defaults__``). One hostile file could then change
how every later file in the same process is read. So the loader here is the pure-Python
``pickle._Unpickler`` with a dispatch table of our own, and these rules, each enforced by the
opcode handlers below:

1. **Globals.** ``GLOBAL`` / ``STACK_GLOBAL`` / ``INST`` / ``OBJ`` resolve (module, name)
   through the allowlist only; anything else is :class:`UnsafeCheckpoint` naming it.
   ``EXT1/2/4`` (copyreg's process-wide registry and cache) and out-of-band buffers are not
   in the table at all; persistent ids only reach a caller's ``persistent_load``.
2. **Nothing a load did not create is ever changed.** Four opcodes change an existing
   object: ``BUILD``, ``APPEND(S)``, ``SETITEM(S)`` and ``ADDITEMS``. Each checks first that
   its target was created by *this* load: a list / dict / set made by an opcode (or by calling
   the builtin type without arguments, as an ``OrderedDict`` reduces), or a :class:`Record`
   made by calling an allowlisted ``Record`` class. The load keeps every object it created
   referenced until it ends, so the identity check cannot be fooled by a recycled id. A global,
   a constant, or anything else an allowlisted function returned is never a target: the
   refusal is :class:`UnsafeCheckpoint`.
3. **BUILD fills declared fields only.** The state must be a dict whose keys are among the
   Record's ``FIELDS`` (or, for a ``TUPLE_STATE`` Record, a tuple of at most that many
   values); a slot state (``setattr``) is refused; the handler writes the instance's
   ``__dict__`` itself and never looks up a ``__setstate__``. Field values are inert data that
   the caller's typed conversion checks.
4. **Calls.** ``REDUCE`` / ``NEWOBJ(_EX)`` / ``OBJ`` / ``INST`` call only what ``find_class``
   handed out in this load, with positional arguments. Every allowlisted callable must be pure
   (a stand-in class, a small function returning a new value, ``tuple``, ``dict``): a
   requirement on each allowlist, met by ours.
5. **Bounded work.** Every load has a work budget of ``WORK_PER_BYTE`` per input byte: each
   call spends the sizes of its arguments before it runs, which bounds what a call such as a
   path join can build (a memoized string joined 250 000 times would otherwise need 128 GiB).
   Dict keys and set members must be cheap to hash - strings, bytes, numbers of at most
   ``MAX_KEY_INT_BITS`` bits, Records (hashed by identity) and flat tuples of those: tuple
   hashes are not cached, and a tuple of shared tuples 60 levels deep hashes 2**60 leaves.
   The memo is a list filled in order (what every pickler writes), so a ``LONG_BINPUT`` of
   index 2**32 cannot allocate.

Why these rules suffice: a pickle reaches objects only through opcodes, and the table holds
exactly three kinds of handlers - pickle's own for the opcodes that push new immutable values
or manage the stack, memo and marks; ours for globals, calls, container construction and the
four changing opcodes; a refusal for every other byte. Calls run allowlisted pure code, so
the only objects any handler changes are ones the same load created, and a shared object -
a class, a function, a dtype stand-in, ``pathlib.PurePath`` - is never changed, whatever the
bytes. (The training core goes further: it never hands a pickle a torch class at all, see
``ckpt_tools.train.checkpoint.safe_dcp``.)

Why not C's ``pickle.Unpickler``: its ``BUILD``, ``APPENDS`` and ``SETITEMS`` cannot be
intercepted (``BUILD`` calls ``setattr`` on whatever is on the stack, ``SETITEMS`` hashes
whatever key it is given). The price: reading a real ``.metadata`` takes about twice as long
as with C's loader (some 0.3 s of CPU per MB), a pathological one up to five times
(docs/reliability.md).
"""

from __future__ import annotations

import io
import itertools
import pickle
import struct
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NoReturn

from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint, shown

Allowlist = Mapping[tuple[str, str], Any]

WORK_PER_BYTE = 8  # call-argument units per input byte: real files spend well under one
WORK_BASE = 1 << 16
MAX_KEY_ITEMS = 64  # a tuple used as a dict key: at most this many scalars, not nested
MAX_KEY_INT_BITS = 1024

# Exceptions a malformed (not hostile) pickle raises while being parsed or while our
# stand-ins reject their arguments.
_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    TypeError,
    ValueError,
    AttributeError,
    IndexError,
    KeyError,
    OverflowError,
    MemoryError,
    RecursionError,
    UnicodeDecodeError,
    struct.error,
)


class _FrozenClass(type):
    """The metaclass of stand-ins: a class handed to a pickle can never be changed.

    C's unpickler (used in an isolated process for large files, :mod:`ckpt_tools.dcp.isolated`)
    runs ``BUILD`` on whatever is on its stack; on a class that is ``setattr`` for a slot state.
    """

    def __setattr__(cls, name: str, value: Any) -> None:
        raise TypeError(f"{cls.__name__} is frozen")

    def __delattr__(cls, name: str) -> None:
        raise TypeError(f"{cls.__name__} is frozen")


class Pure:
    """A pure function as an allowlist hands it out: callable, and nothing about it can be changed.

    A plain function has a writable ``__dict__`` and ``__defaults__``, which C's ``BUILD``
    would set; this wrapper has no ``__dict__``, refuses ``setattr`` and every ``__setstate__``.
    """

    __slots__ = ("_fn",)
    _fn: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any]) -> None:
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("an allowlisted function is frozen")

    def __delattr__(self, name: str) -> None:
        raise TypeError("an allowlisted function is frozen")

    def __setstate__(self, state: Any) -> None:
        raise TypeError("an allowlisted function is frozen")

    def __reduce__(self) -> Any:
        raise TypeError("an allowlisted function is not picklable")

    def __repr__(self) -> str:
        return f"Pure({self._fn.__module__}.{self._fn.__qualname__})"


class Record(metaclass=_FrozenClass):
    """Base of the stand-ins a restricted load may create and fill: plain attribute holders.

    ``FIELDS`` names every attribute the torch class it stands for has (positional order, for
    a call); ``BUILD`` may set those and no others. ``TUPLE_STATE``: the torch class pickles
    its state as a tuple of the fields in order (``TensorProperties``). Records hash and
    compare by identity, so one can be a dict key (``MetadataIndex``) at no cost.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ()
    TUPLE_STATE: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__hash__ is not object.__hash__ or cls.__eq__ is not object.__eq__:
            raise TypeError(f"{cls.__name__}: a Record must hash and compare by identity")

    def __init__(self, *args: Any) -> None:
        if len(args) > len(self.FIELDS):
            raise TypeError(f"{_torch_name(type(self))}: too many arguments")
        self.__dict__.update(zip(self.FIELDS, args, strict=False))

    def __setstate__(self, state: Any) -> None:
        """What C's unpickler (the isolated process) calls for ``BUILD``: the restricted one's rule.

        A dict of declared fields, or for a ``TUPLE_STATE`` Record at most ``len(FIELDS)`` values;
        anything else (an unknown or dunder key, a slot state) is refused. Without it C's ``BUILD``
        would put any key into the instance's ``__dict__`` and the two engines would disagree.
        """
        if self.TUPLE_STATE and type(state) is tuple and len(state) <= len(self.FIELDS):
            self.__dict__.update(zip(self.FIELDS, state, strict=False))
        elif type(state) is dict and all(type(k) is str and k in self.FIELDS for k in state):
            self.__dict__.update(state)
        else:
            raise ValueError(f"{_torch_name(type(self))} state is not its fields")


class TupleStateRecord(Record):
    """A Record whose torch class pickles its state as a tuple of its fields (``TUPLE_STATE``).

    The restricted unpickler's ``BUILD`` fills it itself; C's unpickler (isolated process) calls
    :meth:`Record.__setstate__`, which applies the same rule.
    """

    TUPLE_STATE = True


_SIZED = frozenset({str, bytes, bytearray, tuple, list, dict, set, frozenset})
_KEY_SCALARS = frozenset({str, bytes, float, bool, type(None)})


class _RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    dispatch: ClassVar[dict[int, Callable[[Any], None]]]
    pop_mark: Callable[[], list[Any]]  # pickle's own (pure Python unpickler), rebound per MARK

    def __init__(
        self,
        data: bytes | memoryview,
        allowed: Allowlist,
        what: str,
        persistent_load: Callable[[Any], Any] | None,
    ) -> None:
        super().__init__(io.BytesIO(data))
        self.memo: list[Any] = []  # type: ignore[assignment]
        self._data = data
        self._allowed = allowed
        self._what = what
        self._persistent = persistent_load
        self._work = WORK_PER_BYTE * len(data) + WORK_BASE
        self._fresh: dict[int, Any] = {}  # id → object, for everything this load created
        self._globals: dict[int, str] = {}  # id → "module.name" of what find_class handed out

    def load(self) -> Any:
        """pickle's loop, reading straight from the bytes: the whole input is in memory, so a
        FRAME (a length prefix for streaming readers) is skipped, not buffered. A read past the
        end returns short and the next opcode read ends the load with EOFError."""
        source = io.BytesIO(self._data)
        self.read = read = source.read
        self.readline = source.readline
        self.readinto = source.readinto
        self.metastack: list[list[Any]] = []
        self.stack: list[Any] = []
        self.append = self.stack.append
        self.proto = 0
        dispatch = self.dispatch
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError
                dispatch[key[0]](self)
        except pickle._Stop as stop:  # type: ignore[attr-defined]
            return stop.value

    def load_frame(self) -> None:
        struct.unpack("<Q", self.read(8))

    # ------------------------------------------------------------------ refusals

    def _unsafe(self, message: str) -> NoReturn:
        raise UnsafeCheckpoint(f"{self._what}: {message}")

    def _corrupt(self, message: str) -> NoReturn:
        raise CorruptCheckpoint(f"{self._what}: not a valid pickle ({message})")

    def _describe(self, obj: Any) -> str:
        name = self._globals.get(id(obj))
        return f"the global {name}" if name is not None else shown(obj)

    def _spend(self, units: int) -> None:
        self._work -= units
        if self._work < 0:
            self._corrupt("it builds more than a pickle of its size can describe: a shared-reference bomb?")

    # ------------------------------------------------------------------ globals

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = self._allowed[(module, name)]
        except (KeyError, TypeError):
            self._unsafe(f"refused to load global {module[:100]}.{name[:100]} (checkpoint pickles may only hold data)")
        self._globals[id(found)] = f"{module}.{name}"
        return found

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            self._unsafe("refused a persistent reference (not expected in this file)")
        return self._persistent(pid)

    def load_global(self) -> None:
        module = self.readline()[:-1].decode("utf-8")
        name = self.readline()[:-1].decode("utf-8")
        self.append(self.find_class(module, name))

    def load_stack_global(self) -> None:
        name = self.stack.pop()
        module = self.stack.pop()
        if type(name) is not str or type(module) is not str:
            self._corrupt("STACK_GLOBAL names are not strings")
        self.append(self.find_class(module, name))

    def load_ext(self) -> None:
        self._unsafe("refused a copyreg extension code (EXT opcodes name globals through process-wide state)")

    def refuse_opcode(self) -> None:
        self._corrupt("an opcode torch never writes")

    # ------------------------------------------------------------------ creating objects

    def _new(self, obj: Any) -> Any:
        self._fresh[id(obj)] = obj
        return obj

    def _call(self, func: Any, args: Any, opcode: str) -> Any:
        """``func(*args)``, for a ``func`` this load's ``find_class`` handed out; the result is
        fresh (a target for BUILD and the container opcodes) only when ``func`` is a Record
        class or a builtin container type."""
        if id(func) not in self._globals:
            self._unsafe(f"refused to call {self._describe(func)} ({opcode}): only allowlisted globals are called")
        if type(args) is not tuple:
            self._corrupt(f"{opcode} arguments are {shown(args)}, not a tuple")
        cost = 1 + len(args)
        for a in args:
            if type(a) in _SIZED:
                cost += len(a)
        self._spend(cost)
        if func is dict or func is list or func is set:
            if args:
                self._corrupt(f"{opcode} of {self._globals[id(func)]} with arguments")
            return self._new(func())
        value = func(*args)
        if isinstance(func, type) and issubclass(func, Record) and type(value) is func:
            self._new(value)
        return value

    def _newobj(self, cls: Any, args: Any, kwargs: Any, opcode: str) -> Any:
        """``cls.__new__(cls)`` as torch's dataclasses pickle (no arguments: the state follows in BUILD)."""
        if id(cls) not in self._globals:
            self._unsafe(f"refused to instantiate {self._describe(cls)} ({opcode})")
        if not (isinstance(cls, type) and (issubclass(cls, Record) or cls is dict or cls is list or cls is set)):
            self._corrupt(f"{opcode} of {self._describe(cls)}, which torch never writes")
        if type(args) is not tuple or args or kwargs:
            self._corrupt(f"{opcode} of {self._describe(cls)} with arguments")
        return self._new(object.__new__(cls) if issubclass(cls, Record) else cls())

    def load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self._call(self.stack[-1], args, "REDUCE")

    def load_newobj(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self._newobj(self.stack[-1], args, None, "NEWOBJ")

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        self.stack[-1] = self._newobj(self.stack[-1], args, kwargs, "NEWOBJ_EX")

    def load_obj(self) -> None:
        items = self.pop_mark()
        if not items:
            self._corrupt("OBJ without a class")
        self.append(self._call(items[0], tuple(items[1:]), "OBJ"))

    def load_inst(self) -> None:
        module = self.readline()[:-1].decode("ascii")
        name = self.readline()[:-1].decode("ascii")
        klass = self.find_class(module, name)
        args = tuple(self.pop_mark())  # before self.append: pop_mark rebinds it
        self.append(self._call(klass, args, "INST"))

    # The handlers below run once per container or item of a file: written out, not factored.

    def load_empty_list(self) -> None:
        obj: list[Any] = []
        self._fresh[id(obj)] = obj
        self.append(obj)

    def load_empty_dictionary(self) -> None:
        obj: dict[Any, Any] = {}
        self._fresh[id(obj)] = obj
        self.append(obj)

    def load_empty_set(self) -> None:
        obj: set[Any] = set()
        self._fresh[id(obj)] = obj
        self.append(obj)

    def load_list(self) -> None:
        items = self.pop_mark()  # before self.append: pop_mark rebinds it
        self.append(self._new(items))

    def load_dict(self) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            self._corrupt("DICT with an odd number of items")
        for key in items[::2]:
            self._check_key(key)
        self.append(self._new({items[i]: items[i + 1] for i in range(0, len(items), 2)}))

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        for item in items:
            self._check_key(item)
        self.append(frozenset(items))

    # ------------------------------------------------------------------ changing objects (fresh ones only)

    def _target(self, obj: Any, kind: type, opcode: str) -> None:
        """Refuse ``opcode`` on ``obj`` unless this load created it and it is a ``kind``."""
        if id(obj) not in self._fresh:
            self._unsafe(
                f"refused {opcode} on {self._describe(obj)}: a checkpoint pickle may only fill objects it created"
            )
        if type(obj) is not kind:
            self._corrupt(f"{opcode} on a {type(obj).__name__}")

    def _check_key(self, key: Any) -> None:
        """A dict key or set member must hash in constant time (see the module docstring)."""
        kind = type(key)
        if kind in _KEY_SCALARS or (kind is int and key.bit_length() <= MAX_KEY_INT_BITS):
            return
        if isinstance(key, Record) and id(key) in self._fresh:
            return
        if kind is tuple and len(key) <= MAX_KEY_ITEMS:
            for item in key:
                k = type(item)
                if not (
                    k in _KEY_SCALARS
                    or (k is int and item.bit_length() <= MAX_KEY_INT_BITS)
                    or (isinstance(item, Record) and id(item) in self._fresh)
                ):
                    break
            else:
                return
        self._corrupt(f"a dict key or set member that is {self._describe(key)}, not a plain value")

    def load_append(self) -> None:
        value = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not list or id(target) not in self._fresh:
            self._target(target, list, "APPEND")
        target.append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not list or id(target) not in self._fresh:
            self._target(target, list, "APPENDS")
        target.extend(items)

    def load_setitem(self) -> None:
        stack = self.stack
        value = stack.pop()
        key = stack.pop()
        target = stack[-1]
        if type(target) is not dict or id(target) not in self._fresh:
            self._target(target, dict, "SETITEM")
        if type(key) is not str and not (type(key) is int and key.bit_length() <= MAX_KEY_INT_BITS):
            self._check_key(key)
        target[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not dict or id(target) not in self._fresh:
            self._target(target, dict, "SETITEMS")
        if len(items) % 2:
            self._corrupt("SETITEMS with an odd number of items")
        for i in range(0, len(items), 2):
            key = items[i]
            if type(key) is not str:
                self._check_key(key)
            target[key] = items[i + 1]

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set or id(target) not in self._fresh:
            self._target(target, set, "ADDITEMS")
        for item in items:
            self._check_key(item)
        target.update(items)

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if id(inst) not in self._fresh:
            self._unsafe(
                f"refused BUILD on {self._describe(inst)}: a checkpoint pickle may only fill objects it created"
            )
        if not isinstance(inst, Record):
            self._corrupt(f"BUILD on a {type(inst).__name__}")
        cls = type(inst)
        if type(state) is tuple and len(state) == 2 and (state[0] is None or type(state[0]) is dict):
            state, slots = state
            if slots:
                self._unsafe(f"refused a slot state for {_torch_name(cls)} (BUILD may not set attributes)")
        if state is None:
            return
        if type(state) is tuple and cls.TUPLE_STATE:
            if len(state) > len(cls.FIELDS):
                self._corrupt(f"{_torch_name(cls)} state of {len(state)} values")
            inst.__dict__.update(zip(cls.FIELDS, state, strict=False))
            return
        if type(state) is not dict:
            self._corrupt(f"{_torch_name(cls)} state is {shown(state)}")
        # More keys than fields: one of the first len(FIELDS) + 1 is unknown, and the check stays O(fields).
        for key in itertools.islice(state, len(cls.FIELDS) + 1):
            if type(key) is not str or key not in cls.FIELDS:
                name = _torch_name(cls)
                message = f"{name} state holds the field {shown(key)}, which torch's {name} does not have"
                if type(key) is str and key.startswith("__"):
                    self._unsafe(f"refused {message}")
                self._corrupt(message)
        inst.__dict__.update(state)

    # ------------------------------------------------------------------ the memo: a list, filled in order

    def _put(self, index: int) -> None:
        if index == len(self.memo):
            self.memo.append(self.stack[-1])
        elif 0 <= index < len(self.memo):
            self.memo[index] = self.stack[-1]
        else:
            self._corrupt(f"memo index {shown(index)} out of order")

    def _missing(self, index: int) -> NoReturn:
        self._corrupt(f"memo value not found at index {shown(index)}")

    def load_put(self) -> None:
        self._put(int(self.readline()[:-1]))

    def load_binput(self) -> None:
        self._put(self.read(1)[0])

    def load_long_binput(self) -> None:
        self._put(struct.unpack("<I", self.read(4))[0])

    def load_memoize(self) -> None:
        self.memo.append(self.stack[-1])

    def load_get(self) -> None:
        index = int(self.readline()[:-1])
        if not 0 <= index < len(self.memo):
            self._missing(index)
        self.append(self.memo[index])

    def load_binget(self) -> None:
        index = self.read(1)[0]
        if index >= len(self.memo):
            self._missing(index)
        self.append(self.memo[index])

    def load_long_binget(self) -> None:
        (index,) = struct.unpack("<I", self.read(4))
        if index >= len(self.memo):
            self._missing(index)
        self.append(self.memo[index])


def _torch_name(cls: type) -> str:
    return cls.__name__.lstrip("_")


def _dispatch() -> dict[int, Callable[[Any], None]]:
    """Every opcode: pickle's own handler for those that only push new values (numbers,
    strings, bytes, tuples, marks, frames), ours for the rest, a refusal for the others."""
    base = pickle._Unpickler.dispatch  # type: ignore[attr-defined]
    U = _RestrictedUnpickler
    ours: dict[bytes, Callable[[Any], None]] = {
        pickle.FRAME: U.load_frame,
        pickle.GLOBAL: U.load_global,
        pickle.STACK_GLOBAL: U.load_stack_global,
        pickle.REDUCE: U.load_reduce,
        pickle.NEWOBJ: U.load_newobj,
        pickle.NEWOBJ_EX: U.load_newobj_ex,
        pickle.OBJ: U.load_obj,
        pickle.INST: U.load_inst,
        pickle.EMPTY_LIST: U.load_empty_list,
        pickle.EMPTY_DICT: U.load_empty_dictionary,
        pickle.EMPTY_SET: U.load_empty_set,
        pickle.LIST: U.load_list,
        pickle.DICT: U.load_dict,
        pickle.FROZENSET: U.load_frozenset,
        pickle.APPEND: U.load_append,
        pickle.APPENDS: U.load_appends,
        pickle.SETITEM: U.load_setitem,
        pickle.SETITEMS: U.load_setitems,
        pickle.ADDITEMS: U.load_additems,
        pickle.BUILD: U.load_build,
        pickle.PUT: U.load_put,
        pickle.BINPUT: U.load_binput,
        pickle.LONG_BINPUT: U.load_long_binput,
        pickle.MEMOIZE: U.load_memoize,
        pickle.GET: U.load_get,
        pickle.BINGET: U.load_binget,
        pickle.LONG_BINGET: U.load_long_binget,
        pickle.EXT1: U.load_ext,
        pickle.EXT2: U.load_ext,
        pickle.EXT4: U.load_ext,
        pickle.PERSID: base[pickle.PERSID[0]],  # both end in self.persistent_load
        pickle.BINPERSID: base[pickle.BINPERSID[0]],
    }
    pushes_new_values = (
        pickle.PROTO, pickle.STOP, pickle.MARK, pickle.POP, pickle.POP_MARK, pickle.DUP,
        pickle.NONE, pickle.NEWTRUE, pickle.NEWFALSE,
        pickle.INT, pickle.BININT, pickle.BININT1, pickle.BININT2, pickle.LONG, pickle.LONG1, pickle.LONG4,
        pickle.FLOAT, pickle.BINFLOAT,
        pickle.STRING, pickle.BINSTRING, pickle.SHORT_BINSTRING,
        pickle.UNICODE, pickle.BINUNICODE, pickle.SHORT_BINUNICODE, pickle.BINUNICODE8,
        pickle.BINBYTES, pickle.SHORT_BINBYTES, pickle.BINBYTES8,
        pickle.TUPLE, pickle.EMPTY_TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3,
    )  # fmt: skip
    table: dict[int, Callable[[Any], None]] = {code: U.refuse_opcode for code in range(256)}
    table.update({op[0]: base[op[0]] for op in pushes_new_values})
    table.update({op[0]: handler for op, handler in ours.items()})
    return table


_RestrictedUnpickler.dispatch = _dispatch()


def restricted_loads(
    data: bytes | memoryview,
    allowed: Allowlist,
    *,
    what: str,
    persistent_load: Callable[[Any], Any] | None = None,
) -> Any:
    """Unpickle ``data`` with only ``allowed`` globals; one clear error for anything else.

    ``allowed`` maps (module, name) to what the pickle gets instead: a :class:`Record` class,
    a pure function, ``tuple``, ``dict`` or an immutable value - never a list, dict, set or
    Record instance, which the pickle could then fill (checked here).
    """
    for value in allowed.values():
        if isinstance(value, (list, dict, set, bytearray, Record)):
            raise TypeError(f"allowlist value {value!r} is mutable")
    try:
        return _RestrictedUnpickler(data, allowed, what, persistent_load).load()
    except (UnsafeCheckpoint, CorruptCheckpoint):
        raise
    except _MALFORMED as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptCheckpoint(f"{what}: not a valid pickle ({detail[:200]})") from None


def _fresh_container(kind: type) -> Pure:
    def make(*args: Any) -> Any:
        if args:
            raise ValueError(f"{kind.__name__}() with arguments: torch never pickles one so")
        return kind()

    make.__qualname__ = f"fresh_{kind.__name__}"
    return Pure(make)


def sandbox_allowlist(allowed: Allowlist) -> dict[tuple[str, str], Any]:
    """``allowed`` for C's unpickler (in an isolated process): every value must stay unchanged under it.

    C's ``BUILD``, ``APPEND(S)``, ``SETITEM(S)`` and ``ADDITEMS`` act on whatever is on the stack;
    what an allowlist hands out must refuse all of them: stand-in classes (frozen metaclass),
    :class:`Pure` functions, immutable values and slot-only frozen instances. Builtin container
    types become factories of fresh, empty containers (``dict(big_list)`` would copy an input
    list as often as the pickle names it).
    """
    out: dict[tuple[str, str], Any] = {}
    for key, value in allowed.items():
        if value is dict or value is list or value is set:
            value = _fresh_container(value)
        elif isinstance(value, type):
            if not issubclass(value, Record):
                raise TypeError(f"allowlist value {value!r} is a class C's unpickler could change")
        elif not isinstance(value, (Pure, str, int, float, bytes, tuple, frozenset)) and hasattr(value, "__dict__"):
            raise TypeError(f"allowlist value {value!r} has a __dict__ C's unpickler could fill")
        out[key] = value
    return out


MAX_PLAIN_NODES = 100_000  # an optimizer's param_groups entry holds a handful of values


def protocol2_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode`` as pickle protocol 2 (torch.save's) uses it to write a ``bytes`` value, and only so.

    Protocol 2 has no bytes opcode: ``b"..."`` pickles as ``_codecs.encode("...", "latin1")``
    (``"..."`` the bytes read as latin-1). Anything else - another codec, a non-str - is refused.
    """
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise ValueError(f"_codecs.encode of {shown(text)} with {shown(encoding)}: not how pickle writes bytes")
    return text.encode("latin-1")


def plain_data(value: Any, *, depth: int = 0, max_depth: int = 32, max_nodes: int = MAX_PLAIN_NODES) -> Any:
    """Check that ``value`` is plain JSON-like data (scalars, str, lists, tuples, dicts) and return it.

    Used on BYTE_IO items after a restricted load: anything else, a nesting deeper than
    ``max_depth``, or more than ``max_nodes`` values in all raises ValueError, so callers can
    skip the item with a note. The node budget matters: a few hundred pickle bytes can share
    one list ten levels deep and describe 10**10 values that a plain walk would try to copy.
    """
    budget = [max_nodes]
    return _plain(value, depth, max_depth, budget)


def _plain(value: Any, depth: int, max_depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("holds too many values (a shared-reference bomb?)")
    if depth > max_depth:
        raise ValueError("nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1, max_depth, budget) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise ValueError(f"dict key of type {type(k).__name__}")
            out[str(k)] = _plain(v, depth + 1, max_depth, budget)
        return out
    raise ValueError(f"holds a {type(value).__name__}")
