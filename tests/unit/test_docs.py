"""The manual: every launcher flag is documented, the README's links into `docs/` resolve, and
the MkDocs site builds with strict validation (no broken link or anchor, no page the nav
leaves out)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.driver.cli.launcher_flags import build_parser
from tests.support.paths import REPOSITORY as ROOT
from tests.support.prerequisites import CI_INSTALLS

README = ROOT / "README.md"
DOCS = ROOT / "docs"
FLAGS_PAGE = DOCS / "launcher.md"
# Inline links and images: [text](target) and ![alt](target); a target has no spaces.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
NEEDS_MKDOCS = (
    "needs mkdocs to build the docs (pip install -c constraints.txt mkdocs; in the dev extra); "
    + CI_INSTALLS
)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_every_launcher_flag_is_on_the_flags_page() -> None:
    text = FLAGS_PAGE.read_text()
    flags = [
        option
        for action in build_parser()._actions  # argparse keeps no public list of them
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert len(flags) > 30
    missing = [flag for flag in flags if f"`{flag}" not in text]
    assert missing == [], f"flags missing from {FLAGS_PAGE.relative_to(ROOT)}: {missing}"


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the headings of `page` (Python-Markdown's toc extension)."""
    import markdown  # installed with mkdocs

    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(page.read_text())
    found: set[str] = set()
    tokens = list(md.toc_tokens)  # type: ignore[attr-defined]
    while tokens:
        token = tokens.pop()
        found.add(token["id"])
        tokens.extend(token["children"])
    return found


def _outside_code(text: str) -> str:
    """`text` without its fenced code blocks, where a bracket is no link."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@pytest.mark.skipif(not _has("mkdocs"), reason=NEEDS_MKDOCS)
def test_readme_links_resolve() -> None:
    links = LINK.findall(_outside_code(README.read_text()))
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local), "the README links into docs/"
    broken = []
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else README
        if not target.is_file():
            broken.append(f"{link}: no file {path}")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: {path} has no heading with the id {anchor!r}")
    assert broken == [], f"broken links in README.md: {broken}"


@pytest.mark.skipif(not _has("mkdocs"), reason=NEEDS_MKDOCS)
def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict`, as `.ci/run` runs it: mkdocs.yml makes a link to a missing
    page, a missing anchor, an absolute or unrecognized link and a page left out of the nav
    warnings, and --strict fails the build on any warning."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").is_file()
