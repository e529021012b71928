"""The documents the code cites exist, and so do the sections it cites.

Code, tests, benchmarks and documents cite the files under docs/ as
`docs/<name>.md`, optionally with a section: a quoted heading after the file
name (docs/DESIGN.md, "Numerics"), which may continue on the next line of a
comment, or an anchor (docs/DESIGN.md#numerics). Every citation in the
tracked text files must name a file under docs/ and, where it names a section,
a heading of that file. The design documents live only under docs/: a
citation of a design or papers file anywhere else is an error. Plain pytest,
no TensorFlow.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Dict, Iterator, List, NamedTuple, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# The text files that may cite documents (by suffix, or by whole name).
SUFFIXES = (".py", ".md", ".txt", ".cc", ".h", ".toml", ".cfg", ".sh")
NAMES = ("BUILD", "Makefile", "run")
# Walked only where git cannot list the tracked files (a copy without .git).
SKIPPED_DIRS = {".git", ".venv", "__pycache__", "build", "dist", ".pytest_cache"}

CITATION = re.compile(
    r"docs/(?P<file>[A-Za-z0-9_.-]+?\.md)"
    r"(?:#(?P<anchor>[A-Za-z0-9_-]+)"
    # a quoted heading: after a comma or spaces, or at the start of the next
    # line (past a comment's leader)
    r"|,?[ \t]*(?:\n[ \t]*(?:#+|//|\*)?[ \t]*)?\"(?P<heading>[^\"\n]+)\")?")
# The two design documents named without docs/ in front (any other folder,
# or none).
STRAY = re.compile(r"(?<!docs/)\b(?:DESIGN|PAPERS)\.md")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
# File names assembled, here and below, so that the scan of this very file
# finds no citation in it.
DESIGN, PAPERS = "DESIGN" + ".md", "PAPERS" + ".md"


class Citation(NamedTuple):
    line: int
    file: str
    anchor: Optional[str]
    heading: Optional[str]


def citations(text: str) -> Iterator[Citation]:
    """The citations of docs/ files in `text`, with the line each starts on."""
    for m in CITATION.finditer(text):
        yield Citation(text.count("\n", 0, m.start()) + 1, m.group("file"),
                       m.group("anchor"), m.group("heading"))


def headings(markdown: str) -> List[str]:
    """The headings of a Markdown text, outside fenced code blocks."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            found.append(m.group(2))
    return found


def anchor_of(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def citation_problems(texts: Dict[str, str], docs_dir: pathlib.Path) -> List[str]:
    """One line per citation in `texts` ({path: text}) whose file or section
    does not exist under `docs_dir`."""
    problems, sections = [], {}
    for path, text in sorted(texts.items()):
        for c in citations(text):
            where = f"{path}:{c.line}: docs/{c.file}"
            if c.file not in sections:
                doc = docs_dir / c.file
                sections[c.file] = (headings(doc.read_text(encoding="utf-8"))
                                    if doc.is_file() else None)
            known = sections[c.file]
            if known is None:
                problems.append(f"{where}: no such file under docs/")
            elif c.heading is not None and c.heading not in known:
                problems.append(f'{where}, "{c.heading}": no such heading; it has '
                                f"{known}")
            elif c.anchor is not None and c.anchor not in {anchor_of(h) for h in known}:
                problems.append(f"{where}#{c.anchor}: no heading has that anchor")
    return problems


def stray_problems(texts: Dict[str, str]) -> List[str]:
    """One line per mention of a design document that is not under docs/."""
    return [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)} without docs/"
            for path, text in sorted(texts.items()) for m in STRAY.finditer(text)]


def _cited_kind(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(SUFFIXES) or name in NAMES


def tracked_files() -> List[str]:
    """Repository-relative paths of the text files that may cite documents."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)
                  and not any(part.endswith(".egg-info") for part in p.parts)]
    return sorted(p for p in listed if p and _cited_kind(p) and (ROOT / p).is_file())


def tracked_texts() -> Dict[str, str]:
    return {p: (ROOT / p).read_text(encoding="utf-8", errors="replace")
            for p in tracked_files()}


# ---------------------------------------------------------------------------
# The repository


def test_every_cited_document_and_section_exists():
    problems = citation_problems(tracked_texts(), DOCS)
    assert not problems, "citations of missing documents or sections:\n" + "\n".join(problems)


def test_design_documents_are_cited_only_under_docs():
    texts = tracked_texts()
    misplaced = [p for p in tracked_files()
                 if p.rsplit("/", 1)[-1] in (DESIGN, PAPERS)
                 and not p.startswith("docs/")]
    assert not misplaced, f"design documents outside docs/: {misplaced}"
    problems = stray_problems(texts)
    assert not problems, "cite them as docs/<name>.md:\n" + "\n".join(problems)


def test_the_scan_sees_the_citations_the_code_relies_on():
    """A scan that found nothing would pass the tests above: the code cites
    the numerics contract and both documents by section, so the scan must
    find such citations, in the files that hold them."""
    found = {(path, c.file, c.heading) for path, text in tracked_texts().items()
             for c in citations(text)}
    sections = {(f, h) for _, f, h in found}
    assert (DESIGN, "Numerics") in sections
    assert any(f == PAPERS and h for f, h in sections)
    assert any(f == "KERNEL_ABI" + ".md" for f, _ in sections)
    assert ("tests/optimize_testlib.py", DESIGN, "Numerics") in found
    assert len({s for s in sections if s[1]}) >= 8, sorted(sections)


def test_cited_headings_are_unique():
    """A quoted section must name one place."""
    for doc in sorted(DOCS.glob("*.md")):
        names = headings(doc.read_text(encoding="utf-8"))
        twice = sorted({h for h in names if names.count(h) > 1})
        assert not twice, f"{doc.name} has these headings more than once: {twice}"


# ---------------------------------------------------------------------------
# The checks themselves, on made-up documents

_DOC, _MISSING = "GUIDE" + ".md", "MISSING" + ".md"


def _guide(tmp_path) -> pathlib.Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / _DOC).write_text("# Guide\n\n## Setup steps\n\n```\n## Not a heading\n```\n"
                             "### TF-free core\n", encoding="utf-8")
    return docs


def test_headings_and_anchors(tmp_path):
    docs = _guide(tmp_path)
    assert headings((docs / _DOC).read_text()) == ["Guide", "Setup steps", "TF-free core"]
    assert anchor_of("TF-free core") == "tf-free-core"
    assert anchor_of("How to add an op") == "how-to-add-an-op"


def test_good_citations_pass(tmp_path):
    docs = _guide(tmp_path)
    texts = {
        "a.py": f'# see docs/{_DOC}, "Setup steps" and docs/{_DOC}#tf-free-core\n',
        "b.md": f"[the guide](docs/{_DOC}) and `docs/{_DOC}` alone\n",
        "c.py": f'x = 1  # docs/{_DOC},\n# "TF-free core" says why\n',
    }
    assert citation_problems(texts, docs) == []


def test_a_broken_citation_is_reported(tmp_path):
    docs = _guide(tmp_path)
    texts = {
        "heading.py": f'"""As docs/{_DOC}, "Set-up steps" says."""\n',
        "anchor.md": f"\n\nsee docs/{_DOC}#setup\n",
        "file.txt": f"see docs/{_MISSING}\n",
        "next_line.py": f'# docs/{_DOC},\n#   "Not a heading"\n',
    }
    problems = citation_problems(texts, docs)
    assert len(problems) == 4, problems
    assert problems[0].startswith(f"anchor.md:3: docs/{_DOC}#setup")
    assert problems[1].startswith(f"file.txt:1: docs/{_MISSING}: no such file")
    assert problems[2].startswith(f'heading.py:1: docs/{_DOC}, "Set-up steps": no such')
    assert problems[3].startswith(f'next_line.py:1: docs/{_DOC}, "Not a heading"')


def test_a_design_document_cited_outside_docs_is_reported():
    texts = {"a.py": f"# see {DESIGN}\n# and docs/{DESIGN}\n# and shared/{PAPERS}\n"}
    assert stray_problems(texts) == [f"a.py:1: {DESIGN} without docs/",
                                     f"a.py:3: {PAPERS} without docs/"]
