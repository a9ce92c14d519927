"""docs/: the pages the code cites exist, their links resolve, and every module and function that
docs/modeling.md and docs/baselines.md name still exists (a rename fails here).

Code references in those pages are written `path.py` (`name`, `name`, ...): the names in the
parenthesis right after a path must be defined in that file (def, class, a module-level or field
assignment, or a keyword argument). Expected values come from the tracked files themselves
(`git ls-files`), read as text."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CODE_DOCS = ("modeling.md", "baselines.md")
PAGES = ("README.md", "paper.md", "modeling.md", "artifact.md", "baselines.md")

# `nest/costs/stage.py` (`stage_cost`, `zero_schedule`): a repo path, then its names
REF = re.compile(r"`((?:nest|baselines|tests)/[\w/]+\.py)`\s*\(([^()]*)\)")
PATH = re.compile(r"`((?:nest|baselines|tests|config|workflow|profiles)/[\w./-]+)`")
NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
DOC_MENTION = re.compile(r"\bdocs/([\w-]+\.md)\b")
LINK = re.compile(r"\]\(([\w-]+\.md)(?:#([\w-]+))?\)")
# other projects' docs pages that tracked files cite as sources (file -> page names), not ours
EXTERNAL = {"config/validation/published_runs.yaml": {  # Megatron-Bridge's own docs pages
    "performance-summary.md", "performance-summary-archive.md"}}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / f for f in out.stdout.decode().split("\0") if f]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None


def defines(source: str, name: str) -> bool:
    n = re.escape(name)
    return bool(re.search(rf"\b(?:def|class)\s+{n}\b|^\s*{n}\s*[:=]|\b{n}=", source, re.M))


def code_refs(page: str) -> list[tuple[str, str]]:
    refs = []
    for path, inner in REF.findall((DOCS / page).read_text()):
        refs += [(path, name) for name in NAME.findall(inner)]
    return refs


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def test_every_page_exists():
    for page in PAGES:
        assert (DOCS / page).is_file(), f"docs/{page} is missing"


def test_every_docs_page_cited_by_a_tracked_file_exists():
    cited = {}
    for f in tracked_files():
        text = text_of(f)
        rel = str(f.relative_to(ROOT))
        for page in DOC_MENTION.findall(text or ""):
            if page not in EXTERNAL.get(rel, ()):
                cited.setdefault(page, rel)
    assert cited, "no tracked file cites docs/"
    for page, where in cited.items():
        assert (DOCS / page).is_file(), f"{where} cites docs/{page}, which does not exist"


def test_links_between_pages_resolve():
    for page in PAGES:
        for target, anchor in LINK.findall((DOCS / page).read_text()):
            assert (DOCS / target).is_file(), f"docs/{page} links to missing {target}"
            if anchor:
                heads = [slug(h) for h in re.findall(r"^#+ (.+)$", (DOCS / target).read_text(),
                                                     re.M)]
                assert anchor in heads, f"docs/{page} links to {target}#{anchor}: no such heading"


@pytest.mark.parametrize("page", CODE_DOCS)
def test_cited_paths_exist(page):
    paths = PATH.findall((DOCS / page).read_text())
    assert paths
    for p in paths:
        if "*" not in p and "..." not in p:
            assert (ROOT / p).exists(), f"docs/{page} cites {p}, which does not exist"


@pytest.mark.parametrize("page", CODE_DOCS)
def test_cited_functions_exist(page):
    refs = code_refs(page)
    assert len(refs) >= 20, f"docs/{page}: only {len(refs)} code references parsed"
    missing = [f"{path}: {name}" for path, name in refs
               if not (ROOT / path).is_file() or not defines((ROOT / path).read_text(), name)]
    assert not missing, f"docs/{page} names what its file does not define: {missing}"


def test_the_check_catches_a_rename():
    source = "def stage_cost(problem):\n    pass\nOPT = 1\n"
    assert defines(source, "stage_cost") and defines(source, "OPT")
    assert not defines(source.replace("stage_cost", "stage_costs"), "stage_cost")
    assert not defines("x = stage_cost(1)\n", "stage_cost")  # a call is not a definition
    assert REF.findall("`nest/a.py` (`f`, `g`: text)") == [("nest/a.py", "`f`, `g`: text")]


def test_no_tracked_file_mentions_the_old_digest():
    old = "REFERENCE" + ".md"  # spelled so that this file does not match itself
    hits = [str(f.relative_to(ROOT)) for f in tracked_files() if old in (text_of(f) or "")]
    assert not hits, f"{old} is still mentioned in: {hits}"
