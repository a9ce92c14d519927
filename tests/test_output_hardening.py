"""Every output nest writes (issue 22, items 5 and 10) goes through nest.common.atomic_io: a target that
is not a regular file is refused and left alone, the umask is honoured, a full disk leaves no
temporary file and the old output whole, `nest export` writes all its files or none, and an
infeasible `nest plan -o` leaves no stale plan behind."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import stat
from pathlib import Path

import pytest

from nest.common import atomic_io

from nest.interfaces import cli
from nest.common.errors import SpecError

TINY = ["--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4"]


def _main(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = cli.main(argv)
    return rc, buf.getvalue()


def _special(kind: str, where: Path) -> Path:
    """A target of `kind` at where/'target' (what a rename would wrongly replace)."""
    p = where / "target"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    elif kind == "link_to_device":
        p.symlink_to("/dev/null")
    elif kind == "link_to_fifo":
        os.mkfifo(where / "f")
        p.symlink_to(where / "f")
    elif kind == "link_to_folder":
        (where / "d").mkdir()
        p.symlink_to(where / "d")
    elif kind == "device":
        return Path("/dev/null")
    return p


SPECIAL = ["device", "fifo", "socket", "link_to_device", "link_to_fifo", "link_to_folder"]
COMMANDS = {
    "plan": lambda t: ["plan", *TINY, "-o", str(t)],
    "plan_picture": lambda t: ["plan", *TINY, "--placement-picture", f"{t}"],
    "evaluate": lambda t: ["evaluate", "missing.json", "-o", str(t)],
    "compare": lambda t: ["compare", *TINY, "-o", str(t)],
    "graph": lambda t: ["graph", "--model", "tiny_gpt", "-o", str(t)],
}


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_special_targets_are_refused_and_left_alone(command, kind, tmp_path):
    target = _special(kind, tmp_path)
    if command == "plan_picture" and kind != "device":  # the suffix check comes second
        target = target.rename(target.with_suffix(".png"))
    before = os.lstat(target)
    rc, out = _main(COMMANDS[command](target))
    assert rc == cli.EXIT_ERROR, out
    assert out.count("\n") == 1 and str(target) in out, out
    assert ("never replaced" in out) != (kind == "link_to_folder" and "is a folder" in out), out
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


@pytest.mark.parametrize("name", ["launch.sh", "slurm.sbatch", "args.txt", "rank_map.csv"])
@pytest.mark.parametrize("kind", ["fifo", "link_to_device", "link_to_folder"])
def test_export_refuses_a_special_file_in_its_folder(name, kind, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    target = _special(kind, folder).rename(folder / name)
    rc, out = _main(["export", "missing.yaml", "-o", str(folder)])
    assert rc == cli.EXIT_ERROR and name in out and out.count("\n") == 1, out
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, *(
        ["f"] if kind == "link_to_fifo" else ["d"] if kind == "link_to_folder" else [])])
    assert os.lstat(target).st_mode == os.lstat(target).st_mode


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664),
                                       (0o027, 0o640)])
def test_outputs_honour_the_umask(mask, mode, tmp_path):
    old = os.umask(mask)
    try:
        atomic_io.write_text_atomic(tmp_path / "a.json", "{}\n")
        atomic_io.write_files_atomic(tmp_path / "exp", {"x.sh": "a\n", "y.csv": b"b\n"})
    finally:
        os.umask(old)
    for p in (tmp_path / "a.json", tmp_path / "exp" / "x.sh", tmp_path / "exp" / "y.csv"):
        assert stat.S_IMODE(p.stat().st_mode) == mode, p


def test_cli_outputs_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        rc, out = _main(["plan", *TINY, "--quiet", "-o", str(tmp_path / "p.json")])
        assert rc == 0, out
        rc, out = _main(["export", str(tmp_path / "p.json"), "-o", str(tmp_path / "x")])
        assert rc == 0, out
    finally:
        os.umask(old)
    written = [tmp_path / "p.json", *(tmp_path / "x" / n for n in cli.EXPORT_FILES)]
    assert {stat.S_IMODE(p.stat().st_mode) for p in written} == {0o644}


def _disk_full_after(monkeypatch, n: int) -> None:
    """os.fsync fails with ENOSPC from the (n+1)-th call on, as a full disk would."""
    calls = []
    real = os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) > n:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(atomic_io.os, "fsync", fsync)


@pytest.mark.parametrize("writer", ["text", "bytes", "frame"])
def test_a_full_disk_leaves_the_old_file_and_no_temporary(writer, tmp_path, monkeypatch):
    import pandas as pd

    from nest.experiments.results import write_frame

    target = tmp_path / "out.csv"
    target.write_text("old\n")
    _disk_full_after(monkeypatch, 0)
    with pytest.raises(OSError) as e:
        {"text": lambda: atomic_io.write_text_atomic(target, "new\n"),
         "bytes": lambda: atomic_io.write_bytes_atomic(target, b"new\n"),
         "frame": lambda: write_frame(pd.DataFrame({"a": [1]}), target)}[writer]()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.csv"]


@pytest.mark.parametrize("fail_at", [0, 1, 2, 3])
def test_export_is_all_files_or_none(fail_at, tmp_path, monkeypatch):
    rc, out = _main(["plan", *TINY, "--quiet", "-o", str(tmp_path / "p.json")])
    assert rc == 0, out
    folder = tmp_path / "x"
    _disk_full_after(monkeypatch, fail_at)
    rc, out = _main(["export", str(tmp_path / "p.json"), "-o", str(folder)])
    assert rc == cli.EXIT_ERROR and "No space left on device" in out and str(folder) in out, out
    assert list(folder.iterdir()) == []  # no file, no temporary
    monkeypatch.undo()
    for n in cli.EXPORT_FILES:  # an earlier export stays whole when the next one fails
        (folder / n).write_text("earlier\n")
    _disk_full_after(monkeypatch, fail_at)
    rc, out = _main(["export", str(tmp_path / "p.json"), "-o", str(folder)])
    assert rc == cli.EXIT_ERROR
    assert {(folder / n).read_text() for n in cli.EXPORT_FILES} == {"earlier\n"}
    assert sorted(p.name for p in folder.iterdir()) == sorted(cli.EXPORT_FILES)


def test_an_interrupted_write_leaves_no_temporary(tmp_path):
    target = tmp_path / "t.json"
    with pytest.raises(KeyboardInterrupt):
        with atomic_io.atomic_file(target) as f:
            f.write("half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_special_file_created_during_the_write_is_not_replaced(tmp_path):
    target = tmp_path / "t.json"
    with pytest.raises(SpecError, match="FIFO"):
        with atomic_io.atomic_file(target) as f:
            f.write("x")
            os.mkfifo(target)
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and len(list(tmp_path.iterdir())) == 1


BIG = """name: big
family: gpt
num_layers: 4
hidden_size: 4096
num_heads: 32
ffn_hidden_size: 16384
ffn_type: gelu
vocab_size: 1000
seq_len: 256
"""


def test_no_plan_removes_a_stale_output(tmp_path):
    """A model that fits nowhere on the tiny cluster: nest finds no plan (exit 3), and the plan
    file of an earlier run under the same name is removed, with a message."""
    (tmp_path / "big.yaml").write_text(BIG)
    stale = tmp_path / "stale.json"
    stale.write_text('{"schema": "nest.plan/v1"}\n')
    rc, out = _main(["plan", "--model", str(tmp_path / "big.yaml"), "--cluster", "tiny_cluster",
                     "--num-devices", "4", "--planner", "nest", "--quiet", "-o", str(stale)])
    assert rc == cli.EXIT_INFEASIBLE, out
    assert not stale.exists() and f"removed the earlier {stale}" in out


@pytest.mark.parametrize("planner", ["cost $5", r"$\frac{$", "a$b$c$", r"\$x"])
def test_dollars_in_a_plans_names_are_text_in_every_picture(planner, tmp_path):
    """A shared plan's planner name reaches the timeline, placement and memory pictures'
    titles: a `$` is text there, never mathtext (which fails to parse or renders something
    else)."""
    import json

    rc, out = _main(["plan", *TINY, "--quiet", "-o", str(tmp_path / "p.json")])
    assert rc == 0, out
    d = json.loads((tmp_path / "p.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps(dict(d, planner=planner)))
    pics = {"--timeline": "t.png", "--placement-picture": "pl.png", "--memory-picture": "m.png"}
    argv = ["evaluate", str(tmp_path / "p.json"), "--quiet"]
    for option, name in pics.items():
        argv += [option, str(tmp_path / name)]
    rc, out = _main(argv)
    assert rc == 0, out
    assert all((tmp_path / n).stat().st_size > 0 for n in pics.values())
