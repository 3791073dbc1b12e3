"""Every document the project's files cite is in the repository: a reader has nothing else.

A citation is a name ending in ``.md`` outside a URL; it holds when it names a tracked file from
the repository's root or from the citing file's folder, or ends a tracked file's path
(``performance.md`` for ``docs/performance.md``).
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
CITED = re.compile(r"(?<![\w/.-])([\w][\w./-]*\.md)\b")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def citations(text: str) -> set[str]:
    return set(CITED.findall(URL.sub(" ", text)))


def missing_citations(files: dict[str, str], tracked: set[str]) -> list[tuple[str, str]]:
    """(citing file, cited name) for each cited document that is not among ``tracked``."""
    missing = []
    for path, text in sorted(files.items()):
        here = PurePosixPath(path).parent
        for name in sorted(citations(text)):
            candidates = {name, posixpath.normpath(str(PurePosixPath(here, name)))}
            if candidates & tracked or any(t.endswith("/" + name) for t in tracked):
                continue
            missing.append((path, name))
    return missing


def test_the_checker_finds_a_document_that_is_not_there() -> None:
    absent = "GUIDE" + ".md"
    files = {
        "pkg/mod.py": f"see {absent} for why; docs/feed.md and feed.md and https://example.org/{absent}",
        "docs/feed.md": "as ../README.md says",
        "README.md": "",
    }
    assert missing_citations(files, set(files)) == [("pkg/mod.py", absent)]


def test_no_tracked_file_cites_a_document_missing_from_the_repository() -> None:
    tracked = tracked_files()
    texts = {}
    for path in tracked:
        try:
            texts[path] = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files cite nothing; a file deleted in the work tree is not shipped
    assert missing_citations(texts, set(tracked)) == []
