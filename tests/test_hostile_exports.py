"""`nest export` of shared plans holding hostile strings (issue 22, item 1): the generated files
carry no command the export did not intend.

A hostile string goes into one field (the plan's planner, a model or cluster path, a compact
spec's fields, an argument of the launch script). Either the export refuses it (exit 2, one line,
nothing written) or every file is printable ASCII, `bash -n` accepts both scripts, every
command line of launch.sh is one of the few the exporter writes, and RUNNING launch.sh with a
stub torchrun executes exactly one torchrun whose arguments are the export's own (and creates
no file). The sbatch file's #SBATCH block is whole and its job name is [A-Za-z0-9._-].
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from nest.interfaces import cli
from nest.common.errors import SpecError
from nest.interfaces.export_launch import DATA_ARGS, TRAIN_ARGS, check_text, comment, job_name

ROOT = Path(__file__).resolve().parents[1]
PWNED = "PWNED"
HOSTILE = {
    "newline": f"manual\ntouch {PWNED}\n#",
    "carriage_return": f"x\rtouch {PWNED}",
    "subshell": f"$(touch {PWNED})",
    "backticks": f"`touch {PWNED}`",
    "single_quotes": f"'; touch {PWNED}; '",
    "double_quotes": f'"; touch {PWNED}; "',
    "semicolon": f"a;touch {PWNED}",
    "operators": f"a|touch {PWNED}&b>c<d",
    "ifs": f"${{IFS}}touch${{IFS}}{PWNED}",
    "u2028": f"a\u2028touch {PWNED}",
    "u2029": f"a\u2029touch {PWNED}",
    "u0085": f"a\u0085touch {PWNED}",
    "vertical_tab": f"a\x0btouch {PWNED}",
    "form_feed": f"a\x0ctouch {PWNED}",
    "escape_sequence": "a\x1b[2J\x1b]0;title\x07b",
    "rtl_override": "a\u202etxt.sh",
    "nbsp": "a\u00a0b",
    "non_ascii_letters": "modèle-ß",
    "sbatch_break": f"x\n#SBATCH --wrap='touch {PWNED}'",
    "very_long": "a" * 5000,
}
# what a file name can hold (no '/', no NUL, at most 255 bytes)
AS_FILE = {k: v for k, v in HOSTILE.items() if len(v.encode()) < 200 and "/" not in v}
REFUSED_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u00a0\u2028\u2029\u202e]")
LAUNCH_COMMANDS = ("NODES=(", "NPROC=(", "VISIBLE=(", "export ", "unset ", "DATA_ARGS=",
                   "TRAIN_ARGS=", "set -euo pipefail",
                   'cd "${MEGATRON_LM:-.}"')


@pytest.fixture(scope="module")
def base_plan(tmp_path_factory) -> dict:
    t = tmp_path_factory.mktemp("base")
    assert cli.main(["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                     "--num-devices", "4", "--quiet", "-o", str(t / "p.json")]) == 0
    return json.loads((t / "p.json").read_text())


def _stub_torchrun(folder: Path) -> Path:
    """A `torchrun` that records its arguments, one per line."""
    b = folder / "bin"
    b.mkdir()
    (b / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > '
                                f'"{folder}/torchrun.args"\n')
    (b / "torchrun").chmod(0o755)
    return b


def check_exported(folder: Path, work: Path) -> None:
    """The export in `folder` holds exactly the intended commands (module docstring)."""
    files = {n: (folder / n).read_text() for n in cli.EXPORT_FILES}
    for name, text in files.items():
        assert re.fullmatch(r"[ -~\n]*", text), f"{name}: a non-printable character"
    for name in ("launch.sh", "slurm.sbatch"):
        r = subprocess.run(["bash", "-n", str(folder / name)], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
    # launch.sh: comments, the allow-listed assignments, one torchrun command (continued lines)
    lines = files["launch.sh"].split("\n")
    assert lines[0] == "#!/usr/bin/env bash" and lines[-1] == ""
    body = [ln for ln in lines[1:-1] if not ln.startswith("# ")]
    start = next(i for i, ln in enumerate(body) if ln.startswith("torchrun "))
    for ln in body[:start]:
        assert ln.startswith(LAUNCH_COMMANDS), f"launch.sh: unexpected line {ln!r}"
    assert all(ln.endswith(" \\") for ln in body[start:-1])
    assert body[-1] == "    $DATA_ARGS $TRAIN_ARGS"
    args = (folder / "args.txt").read_text().split("\n")[:-1]
    words = shlex.split(" ".join(ln[:-2] if ln.endswith(" \\") else ln for ln in body[start:]))
    assert words[words.index("pretrain_gpt.py") + 1:-2] == args
    # run it: one torchrun, exactly these arguments, nothing else happens
    stub = _stub_torchrun(work)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "NODE_RANK": "0", "MASTER_ADDR": "localhost",
           "HOME": str(work)}
    r = subprocess.run(["bash", str(folder / "launch.sh")], cwd=work, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = (work / "torchrun.args").read_text().split("\n")[:-1]
    entry = got.index("pretrain_gpt.py")
    assert got[entry + 1:] == [*args, *DATA_ARGS, *TRAIN_ARGS]
    assert not list(work.rglob(f"*{PWNED}*"))
    # slurm.sbatch: the #SBATCH block right after the shebang, a job name any scheduler takes
    sb = files["slurm.sbatch"].split("\n")
    block = [ln for ln in sb[1:] if ln.startswith("#")]
    assert sb[1:1 + len(block)] == block and all(ln.startswith("#SBATCH --") for ln in block)
    assert re.fullmatch(r"#SBATCH --job-name=[A-Za-z0-9._-]{1,64}", block[0])


def _export(tmp_path: Path, plan_file: Path) -> tuple[int, str, Path]:
    out = tmp_path / "exported"
    work = tmp_path / "work"
    work.mkdir()
    cwd = os.getcwd()
    os.chdir(work)  # anything the export (or its scripts) might run lands here
    try:
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = cli.main(["export", str(plan_file), "-o", str(out)])
    finally:
        os.chdir(cwd)
    return rc, buf.getvalue(), out


def _outcome(tmp_path: Path, plan_file: Path, value: str) -> None:
    rc, out, folder = _export(tmp_path, plan_file)
    if rc == 0:
        assert not REFUSED_CHARS.search(value), "a control / separator character was accepted"
        check_exported(folder, tmp_path / "work")
    else:
        assert rc == cli.EXIT_ERROR, out
        assert out.startswith("error: ") and out.count("\n") == 1, out
        assert not REFUSED_CHARS.search(out[:-1]), "the error line echoes a control character"
        assert len(out) < 600 and not folder.exists()
    assert not list((tmp_path / "work").rglob(f"*{PWNED}*"))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_planner(case, base_plan, tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(dict(base_plan, planner=HOSTILE[case])))
    rc, out, folder = _export(tmp_path, f)
    # the planner is a registry name: anything else is refused before a file is written
    assert rc == cli.EXIT_ERROR and "planner" in out and not folder.exists(), out
    assert not REFUSED_CHARS.search(out[:-1]) and out.count("\n") == 1


@pytest.mark.parametrize("key", ["model", "cluster"])
@pytest.mark.parametrize("case", sorted(AS_FILE))
def test_hostile_catalog_path(case, key, base_plan, tmp_path):
    """A model or cluster given as a path whose file name is hostile (the file is a real copy)."""
    src = ROOT / "config" / ("models" if key == "model" else "clusters") / f"{base_plan[key]}.yaml"
    d = tmp_path / "files"
    d.mkdir()
    target = d / f"{AS_FILE[case]}.yaml"
    shutil.copy(src, target)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(dict(base_plan, **{key: str(target)})))
    _outcome(tmp_path, f, AS_FILE[case])


@pytest.mark.parametrize("case", ["newline", "subshell", "u2028", "double_quotes"])
def test_hostile_compact_spec(case, tmp_path):
    """The compact YAML plan form: a hostile planner name is refused like a full plan's."""
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4,
                             "global_batch": 8, "pp": 2, "dp": 2, "planner": HOSTILE[case]}))
    rc, out, folder = _export(tmp_path, f)
    assert rc == cli.EXIT_ERROR and not folder.exists(), out
    assert not REFUSED_CHARS.search(out[:-1]) and out.count("\n") == 1


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_text_checks_comments_and_job_names(case):
    """The three primitives every generated line goes through."""
    s = HOSTILE[case]
    line = comment(s)
    assert line.startswith("# ") and re.fullmatch(r"[ -~]*", line) and len(line) <= 402
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", job_name(s))
    if REFUSED_CHARS.search(s) or len(s) > 1024:
        with pytest.raises(SpecError):
            check_text(s, "x")
    else:
        assert check_text(s, "x") == s


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_argument_values_are_refused_or_quoted(case, tmp_path):
    """An argument value (were one ever to come from a file) is one shell word, or refused."""
    from nest.interfaces.export_launch import torchrun_script

    ranks = [{"rank": 0, "node": 0, "local_rank": 0, "device": 0}]
    args = ["--num-layers", "4", "--data-path", HOSTILE[case], "--bf16"]
    try:
        text = torchrun_script(args, "pretrain_gpt.py", {}, ranks, 1)
    except SpecError:
        assert REFUSED_CHARS.search(HOSTILE[case]) or len(HOSTILE[case]) > 1024
        return
    script = tmp_path / "launch.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + text + "\n")
    stub = _stub_torchrun(tmp_path)
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": f"{stub}:/usr/bin:/bin", "NODE_RANK": "0",
                            "MASTER_ADDR": "localhost"}, timeout=60)
    assert r.returncode == 0, r.stderr
    got = (tmp_path / "torchrun.args").read_text().split("\n")[:-1]
    assert got[got.index("pretrain_gpt.py") + 1:] == [*args, *DATA_ARGS, *TRAIN_ARGS]
    assert not list(tmp_path.rglob(f"*{PWNED}*"))


def test_plain_export_passes_the_same_checks(base_plan, tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(base_plan))
    rc, out, folder = _export(tmp_path, f)
    assert rc == 0, out
    check_exported(folder, tmp_path / "work")
