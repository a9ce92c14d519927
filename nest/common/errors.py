"""Error types: bad input (file, key, expectation) vs internal invariants (assert).

Every message of a SpecError is one line of at most MAX_MESSAGE characters, whatever the input
held (a shared file may put a megabyte string or a newline in a value): `short` shows a user
value truncated, and the constructor folds and caps the whole message as a backstop.
"""

from __future__ import annotations

import reprlib

MAX_MESSAGE = 400  # characters of one error line at most
_ELLIPSIS = " ..."

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 2, 60, 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4


def short(value) -> str:
    """repr(value) in a few dozen characters at most, on one line (reprlib: a huge nested list
    or string is never rendered in full)."""
    try:
        text = _repr.repr(value)
    except (ValueError, RecursionError):  # an int beyond Python's digit limit, a cycle
        text = f"<{type(value).__name__}>"
    return one_line(text, 80)


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), cut to
    `limit` characters with ' ...' at the cut."""
    text = str(text)
    if len(text) > 4 * limit:  # do not fold megabytes only to cut them
        text = text[:4 * limit]
    text = " ".join(text.split())
    # control and format characters (ESC, bidi overrides, ...) shown escaped: a message echoes
    # user text to a terminal, which must not interpret it
    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    return text if len(text) <= limit else text[:limit - len(_ELLIPSIS)] + _ELLIPSIS


class SpecError(ValueError):
    """Bad user input: the message names the file or key and what was expected (one line,
    at most MAX_MESSAGE characters)."""

    def __init__(self, message: object = "", *args):
        super().__init__(one_line(message), *args)


class PlanError(SpecError):
    """A malformed plan (not an infeasible one: infeasibility is a result, not an error)."""


def debug_enabled() -> bool:
    """$NEST_DEBUG turns tracebacks on only when truthy: 1, true, yes or on (any case);
    unset, empty, 0, false, no and off leave it off."""
    import os

    return os.environ.get("NEST_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")
