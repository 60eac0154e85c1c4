"""The value format between the candidate's process and the test checker (both inside the sandbox).

Why a format of our own: the checker must compare what the candidate returned with the expected value by
type and value, never by calling an object the candidate built (its `__eq__`, `__hash__`, `__repr__`
could say anything). So a value crosses the process boundary as JSON of plain builtin types, and the
checker only ever sees the objects `decode` builds: None, bool, int, float, complex, str, bytes, list,
tuple, dict, set, frozenset. Anything else the candidate returns (an instance of its own class) becomes
an opaque `Ref` that the checker can pass back to the candidate but that equals only itself.

Subclasses of builtin types (a Counter, a namedtuple, an IntEnum) are sent as their base type, which is
how the benchmarks' own `==` would have compared them. Floats are JSON numbers (repr round-trips
exactly; NaN and infinities as JSON's extensions); ints outside 2**53 travel as hex (Python limits
decimal ints to 4300 digits; hex is not limited). Runs under any Python 3.8+, stdlib only.
"""

import json

_SAFE_INT = 2 ** 53
_SCALARS = (type(None), bool, int, float, str)
MAX_DEPTH = 200


class Ref:
    """A candidate object that has no plain-data form: passed back by id, equal only to itself."""

    __slots__ = ("id",)

    def __init__(self, ref_id):
        self.id = ref_id

    def __repr__(self):
        return "<object #%d of the tested code>" % self.id


class Named:
    """A global of the candidate's module, by name (the objects an MBPP setup builds with its classes)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "<%s of the tested code>" % self.name


# builtin types travel by name (MBPP passes `int` and `str` as arguments); they compare by identity
TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset, object, type(None))}


def _no_name(name):
    raise WireError("a global of the tested code cannot be sent this way")


class WireError(ValueError):
    """Data that does not follow the format: the checker treats it as a wrong answer."""


def encode(value, refs=None, depth=0):
    """A JSON-ready form of `value`; `refs` (a list) collects objects sent by reference."""
    if depth > MAX_DEPTH:
        raise WireError("value nested deeper than %d levels" % MAX_DEPTH)
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -_SAFE_INT < value < _SAFE_INT else ["i", hex(value)]
    if kind is float:
        return value  # JSON keeps a float a float ("1.0"), exactly (repr round-trips), NaN and infinities included
    if kind is Ref:
        return ["r", value.id]
    if kind is Named:
        return ["n", value.name]
    if kind is type and TYPES.get(value.__name__) is value:
        return ["T", value.__name__]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return encode(int.__pos__(value), refs, depth)
    if isinstance(value, float):
        return float.__pos__(value)
    if isinstance(value, complex):
        return ["c", float.hex(complex.__getattribute__(value, "real")), float.hex(complex.__getattribute__(value, "imag"))]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return ["b", bytes(value).hex()]
    inner = depth + 1
    if isinstance(value, dict):
        return ["d", [[encode(k, refs, inner), encode(v, refs, inner)] for k, v in dict.items(value)]]
    if kind is list and all(type(v) in _SCALARS and (type(v) is not int or -_SAFE_INT < v < _SAFE_INT) for v in value):
        return ["l", value]  # the common case (a long list of numbers or strings) without a call per item
    if isinstance(value, list):
        return ["l", [encode(v, refs, inner) for v in list.__iter__(value)]]
    if isinstance(value, tuple):
        return ["t", [encode(v, refs, inner) for v in tuple.__iter__(value)]]
    if isinstance(value, frozenset):
        return ["F", [encode(v, refs, inner) for v in frozenset.__iter__(value)]]
    if isinstance(value, set):
        return ["s", [encode(v, refs, inner) for v in set.__iter__(value)]]
    if refs is None:
        raise WireError("cannot send a %s" % kind.__name__)
    refs.append(value)
    return ["r", len(refs) - 1]


def decode(data, resolve=Ref, depth=0, resolve_name=_no_name):
    """Plain builtin objects from `encode`'s form; `resolve` maps a reference id to an object and
    `resolve_name` a global's name (only the candidate's side may accept those)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested deeper than %d levels" % MAX_DEPTH)
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise WireError("malformed value")
    tag, inner = data[0], depth + 1
    try:
        if tag == "i":
            return int(data[1], 16)
        if tag == "c":
            return complex(float.fromhex(data[1]), float.fromhex(data[2]))
        if tag == "b":
            return bytes.fromhex(data[1])
        if tag == "r":
            if type(data[1]) is not int:
                raise WireError("malformed reference")
            return resolve(data[1])
        if tag == "n":
            if type(data[1]) is not str:
                raise WireError("malformed name")
            return resolve_name(data[1])
        if tag == "T":
            if data[1] not in TYPES:
                raise WireError("not a builtin type")
            return TYPES[data[1]]
        items = data[1]
        if type(items) is not list:
            raise WireError("malformed container")
        if tag == "l":
            if all(type(v) in _SCALARS for v in items):
                return items  # JSON already built exactly these plain objects
            return [decode(v, resolve, inner, resolve_name) for v in items]
        if tag == "t":
            return tuple(decode(v, resolve, inner, resolve_name) for v in items)
        if tag == "s":
            return set(decode(v, resolve, inner, resolve_name) for v in items)
        if tag == "F":
            return frozenset(decode(v, resolve, inner, resolve_name) for v in items)
        if tag == "d":
            return {decode(k, resolve, inner, resolve_name): decode(v, resolve, inner, resolve_name) for k, v in items}
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise WireError("malformed value: %s" % exc) from None
    raise WireError("unknown tag %r" % tag[:20])


def dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def loads(raw):
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise WireError("unreadable message: %s" % str(exc)[:200]) from None


def send(fd, obj):
    """One length-prefixed JSON message on a pipe."""
    import os
    body = dumps(obj)
    frame = b"%d\n" % len(body) + body
    view = memoryview(frame)
    while view:
        view = view[os.write(fd, view):]


def receive(fd, limit):
    """The next message, or None at end of stream; a message over `limit` bytes is a WireError."""
    import os
    header = b""
    while not header.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        header += chunk
        if len(header) > 20:
            raise WireError("malformed message header")
    try:
        size = int(header)
    except ValueError:
        raise WireError("malformed message header") from None
    if not 0 <= size <= limit:
        raise WireError("message of %d bytes over the %d-byte limit" % (size, limit))
    parts, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return loads(b"".join(parts))
