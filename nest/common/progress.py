"""A light progress line on stderr for anything over a second: a phase, a count, the elapsed time.

Off when stderr is not a terminal, with `nest --quiet`, or with NEST_PROGRESS=0; it never writes
to stdout and never changes a result. Long loops report through `update(done, total)` (or
`log(text)`, the shape of nest.solver.search's `log` callback) from anywhere inside a
`status(...)` block; outside one both are no-ops, so library code may call them freely.

    with progress.status("planning with nest"):
        ...
        progress.update(visited, total)   # "planning with nest  12/40  3.2 s"
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

DELAY_S = 1.0  # nothing is drawn for a phase that ends sooner
TICK_S = 0.1
_FRAMES = "|/-\\"

_enabled = True  # cleared by `nest --quiet`
_current: "_Line | None" = None


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = on


def enabled() -> bool:
    """Whether progress lines are allowed at all (`set_enabled`; `nest --quiet` clears it)."""
    return _enabled


def active() -> bool:
    """Whether a line would be drawn: a terminal on stderr, not quiet, NEST_PROGRESS not 0."""
    stream = sys.stderr
    return (_enabled and os.environ.get("NEST_PROGRESS", "1") != "0"
            and hasattr(stream, "isatty") and stream.isatty())


class _Line:
    def __init__(self, label: str, stream):
        self.label, self.stream = label, stream
        self.count = ""
        self.t0 = time.perf_counter()
        self.stop = threading.Event()
        self.drawn = 0  # characters on the terminal line
        self.thread = threading.Thread(target=self._run, daemon=True)

    def text(self, frame: int) -> str:
        dt = time.perf_counter() - self.t0
        return f"{_FRAMES[frame % 4]} {self.label}{'  ' + self.count if self.count else ''}  {dt:.1f} s"

    def _run(self) -> None:
        if self.stop.wait(DELAY_S):
            return
        frame = 0
        while not self.stop.is_set():
            self._draw(self.text(frame))
            frame += 1
            self.stop.wait(TICK_S)

    def _draw(self, s: str) -> None:
        try:
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            cols = 0
        width = cols - 1 if cols >= 20 else 79  # a pseudo-terminal may report 0 columns
        s = s[:width]
        try:
            self.stream.write("\r" + s + " " * max(self.drawn - len(s), 0))
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal: progress is never worth an error
            self.stop.set()
        self.drawn = len(s)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        if self.drawn:
            self._draw("")
            try:
                self.stream.write("\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass


@contextmanager
def status(label: str):
    """Show `label` (with the count of `update` and the elapsed time) while the block runs, once
    it has run for DELAY_S; the line is erased at the end. Nested blocks relabel the line."""
    global _current
    if _current is not None:  # nested: relabel the open line, restore it afterwards
        outer, outer_count = _current.label, _current.count
        _current.label, _current.count = label, ""
        try:
            yield
        finally:
            _current.label, _current.count = outer, outer_count
        return
    if not active():
        yield
        return
    line = _Line(label, sys.stderr)
    _current = line
    line.thread.start()
    try:
        yield
    finally:
        _current = None
        line.close()


def update(done: int, total: int | None = None, what: str = "") -> None:
    """Report a count in the open status line (a no-op without one)."""
    line = _current
    if line is not None:
        line.count = f"{done}/{total}" if total else str(done)
        if what:
            line.count += f" {what}"


def log(text: str) -> None:
    """A `log` callback (nest.solver.search's shape): the latest message, shortened, as the
    count of the open status line."""
    line = _current
    if line is not None:
        line.count = " ".join(str(text).split())[:60]
