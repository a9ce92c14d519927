"""Every file nest writes goes through here: whole or not at all, never onto a special file.

Contract (issue 22):
    - a target that exists and is not a regular file (a folder, a character device such as
      /dev/null, a FIFO, a socket, a symlink to one) is refused with a SpecError naming it: a
      rename would replace it with a regular file;
    - the text goes to a temporary file in the target's folder (`.<name>.<random>.tmp`), is
      flushed to disk and renamed over the target, so a reader or an interrupted run sees the
      old file or the new one, never half of one; the temporary file is removed on any failure
      (a full disk leaves nothing behind);
    - the file gets the mode an ordinary `open(path, "w")` would give (0666 less the umask), not
      mkstemp's 0600;
    - several files that belong together (`nest export`) are all written to temporaries first
      and renamed only when every one is complete: all of them or none;
    - `remove_stale` deletes an earlier output of the same name when a run produces none, so a
      later step cannot read it as this run's.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from nest.common.errors import SpecError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_target(path: str | os.PathLike, option: str = "") -> None:
    """SpecError if `path` exists and is not a regular file (a symlink is followed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SpecError(f"{_who(path, option)}: cannot be written: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else
                "a character device" if stat.S_ISCHR(st.st_mode) else
                "a block device" if stat.S_ISBLK(st.st_mode) else
                "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        link = " (through a symbolic link)" if os.path.islink(path) else ""
        raise SpecError(f"{_who(path, option)}: exists and is {kind}{link}; expected a regular "
                        f"file or a new name (it is never replaced)")


def _who(path, option: str) -> str:
    return f"{option} {path}" if option else str(path)


@contextlib.contextmanager
def _temporary(path: Path, binary: bool) -> Iterator[tuple[IO, str]]:
    """A temporary file beside `path` with the umask's mode, removed if the block fails."""
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a full disk: name the file that was being written
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, binary: bool = False) -> Iterator[IO]:
    """`with atomic_file(p) as f: f.write(...)`: `p` appears whole when the block ends, or not at
    all if it raises (the old file, if any, stays)."""
    path = Path(path)
    check_target(path)
    with _temporary(path, binary) as (f, tmp):
        yield f
    _replace(tmp, path)


def _replace(tmp: str, path: Path) -> None:
    try:
        check_target(path)  # a special file created since the check: still never replaced
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_file(path, binary=True) as f:
        f.write(data)


def write_files_atomic(folder: str | os.PathLike, files: dict[str, str | bytes]) -> None:
    """Write every `files[name]` into `folder` (created if missing): all are written to
    temporaries first and renamed only once all are complete, so a failure (a full disk, a
    special file in the way) leaves the folder as it was."""
    folder = Path(folder)
    for name in files:
        check_target(folder / name)
    folder.mkdir(parents=True, exist_ok=True)
    done: list[tuple[str, Path]] = []
    try:
        with contextlib.ExitStack() as stack:
            for name, data in files.items():
                f, tmp = stack.enter_context(_temporary(folder / name, isinstance(data, bytes)))
                f.write(data)
                done.append((tmp, folder / name))
        for _, path in done:
            check_target(path)
        for tmp, path in done:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in done:
            Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale(path: str | os.PathLike) -> bool:
    """Remove an earlier output at `path` (a regular file only); True if there was one."""
    p = Path(path)
    if p.is_file():
        p.unlink()
        return True
    return False


def savefig_atomic(fig, path: str | os.PathLike, **kw) -> None:
    """A matplotlib figure saved atomically in the format its suffix names."""
    fmt = Path(path).suffix.lower().lstrip(".")
    with atomic_file(path, binary=True) as f:
        fig.savefig(f, format=fmt, **kw)


def check_output(path, option: str = "-o", folder_files=None) -> None:
    """Before any work: `path` can be written (its folder exists and is writable; a file output
    is not a folder, a folder output is not a file). SpecError naming the option otherwise.
    `folder_files`: None for a file output; for a folder output, the names written in it."""
    p = Path(path)
    folder = folder_files is not None
    if folder:
        if p.exists() and not p.is_dir():
            raise SpecError(f"{option} {path}: exists and is a file; expected a folder (or a new "
                            f"name) for the exported files")
        for name in folder_files:
            check_target(p / name, option)
        parent = p if p.is_dir() else p.parent
    else:
        if p.is_dir():
            raise SpecError(f"{option} {path}: is a folder; expected a file name")
        check_target(p, option)  # a device, FIFO or socket is never replaced
        parent = p.parent
    parent = parent if str(parent) else Path(".")
    if not parent.is_dir():
        up = parent
        while str(up) not in ("", ".", "/") and not up.exists():
            up = up.parent
        if folder and up.is_dir():  # export creates the folders
            parent = up
        else:
            raise SpecError(f"{option} {path}: folder {parent} does not exist")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise SpecError(f"{option} {path}: cannot write in folder {parent}: "
                        f"{e.strerror or e}") from None
