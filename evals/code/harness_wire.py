"""Plain data across the sandbox's pipe: the first half of the harness (``oracle_harness.py``
is appended to it to make the program the sandbox runs; never imported inside the sandbox).

``encode``/``decode``: values of a closed set of builtin types (None, bool, int, float, complex,
str, bytes, list, tuple, dict, set, frozenset, nested) to tagged lists and back into fresh builtin
values; anything else is a ``CrossingError``. ``send``/``recv``: length-prefixed messages of
nested lists of str, bool and None in a small text format (no json: its import costs as much as
a whole run). Exceptions cross as builtin type name and message.
"""

import builtins
import os

MAX_REPLY = 32 << 20
# The candidate's exit status when it ran out of memory where it could not report it (while
# formatting or sending its reply): the oracle reads it as ``memory``.
OUT_OF_MEMORY_STATUS = 86
OUT_OF_MEMORY_REPLY = ["E", "MemoryError", "out of memory"]
# The harness's own exit status when it failed before the program could run or be judged (no
# process to fork, a privilege it could not drop): the caller reads it as ``sandbox_error``, a
# failure of the machine, never of the program. Its reason is the last line it wrote to stderr,
# after ``HARNESS_FAILED_MARK``.
HARNESS_FAILED_STATUS = 87
HARNESS_FAILED_MARK = "entropyrl sandbox harness failed:"
BUILTIN_NAMES = frozenset(builtins.__dict__)
EXCEPTIONS = {
    k: v for k, v in builtins.__dict__.items() if isinstance(v, type) and issubclass(v, Exception) and not issubclass(v, Warning)
}


class CrossingError(Exception):
    """A value or a message that cannot cross between the two processes (a typed ``fail``)."""


class Ended(CrossingError):
    """The candidate's process is gone (exited, killed, out of CPU time)."""


class CandidateError(Exception):
    """An exception of a type the program defined itself, rebuilt by name and message."""


# --- plain data: encode exactly-typed builtin values, decode into fresh builtin values -----------


def encode(x, depth=0):
    if depth > 200:
        raise CrossingError("value nested deeper than 200 levels")
    t = type(x)
    if x is None:
        return None
    if t is bool:
        return x
    if t is int:
        return ["i", hex(x)]
    if t is float:
        return ["f", x.hex()]
    if t is complex:
        return ["c", x.real.hex(), x.imag.hex()]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["b", x.hex()]
    if t in (list, tuple, set, frozenset):
        return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[t], [encode(v, depth + 1) for v in x]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]]
    raise CrossingError(f"a value of type {t.__name__} cannot cross the process boundary (plain data only)")


def decode(x):
    if x is None or x is True or x is False:
        return x
    if type(x) is not list or not x or type(x[0]) is not str:
        raise CrossingError("malformed value")
    tag = x[0]
    if tag == "i":
        return int(x[1], 16)
    if tag == "f":
        return float.fromhex(x[1])
    if tag == "c":
        return complex(float.fromhex(x[1]), float.fromhex(x[2]))
    if tag == "s" and type(x[1]) is str:
        return x[1]
    if tag == "b":
        return bytes.fromhex(x[1])
    if tag in ("l", "t", "S", "F") and type(x[1]) is list:
        items = [decode(v) for v in x[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and type(x[1]) is list:
        return {decode(k): decode(v) for k, v in x[1]}
    raise CrossingError("malformed value")


def encode_exc(exc):
    return ["E", type(exc).__name__, str(exc)[:2000]]


def decode_exc(msg):
    name, text = str(msg[1]), str(msg[2])
    cls = EXCEPTIONS.get(name)
    return cls(text) if cls is not None else CandidateError(f"{name}: {text}")


# --- framing: 4-byte length, then the message: nested lists of str, bool and None, written as
# N T F | s<len>:<text> | l<count>:<items> (no json: its import alone costs as much as a run)


def dumps(obj, out):
    if obj is None or obj is True or obj is False:
        out.append("N" if obj is None else "T" if obj else "F")
    elif type(obj) is str:
        out.append(f"s{len(obj)}:")
        out.append(obj)
    elif type(obj) is list:
        out.append(f"l{len(obj)}:")
        for v in obj:
            dumps(v, out)
    else:
        raise CrossingError(f"a value of type {type(obj).__name__} in a message")
    return out


def loads(text, i=0, depth=0):
    """``(object, next index)``; anything malformed is a ``ValueError``."""
    tag = text[i]
    if tag in "NTF":
        return {"N": None, "T": True, "F": False}[tag], i + 1
    colon = text.index(":", i, i + 24)
    n = int(text[i + 1 : colon])
    if n < 0 or depth > 250:
        raise ValueError("bad length")
    if tag == "s":
        if colon + 1 + n > len(text):
            raise ValueError("short text")
        return text[colon + 1 : colon + 1 + n], colon + 1 + n
    if tag != "l":
        raise ValueError("bad tag")
    items, i = [], colon + 1
    for _ in range(n):
        v, i = loads(text, i, depth + 1)
        items.append(v)
    return items, i


def send(fd, obj):
    data = "".join(dumps(obj, [])).encode("utf-8", "surrogatepass")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def recv(fd, limit=MAX_REPLY):
    head = _read(fd, 4)
    size = int.from_bytes(head, "big")
    if size > limit:
        raise CrossingError(f"reply of {size} bytes is over the {limit}-byte limit")
    try:
        text = _read(fd, size).decode("utf-8", "surrogatepass")
        obj, end = loads(text)
    except (ValueError, IndexError, KeyError, RecursionError) as exc:
        raise CrossingError(f"malformed message ({type(exc).__name__})") from None
    if end != len(text):
        raise CrossingError("malformed message (trailing data)")
    return obj


def _read(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise Ended("the program's process ended")
        buf += chunk
    return buf
