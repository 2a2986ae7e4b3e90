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


# --- module paths named in the manual ---------------------------------------------------------

PACKAGE = ROOT / "elastic"
# A block the check passes over: a walk of the code as it stood before a move, kept for
# comparison, whose paths are those of that older layout and say so.
OLD_LAYOUT = re.compile(r"<!-- old-layout -->.*?<!-- /old-layout -->", re.S)


def _subpackages(folder: Path) -> dict[str, Path]:
    """The packages right under `folder`, by name -> the folder their paths start from."""
    return {p.parent.name: folder for p in sorted(folder.glob("*/__init__.py"))}


# Where a named path starts from, by its first folder: `elastic/` from the repository's root;
# `driver/`, `worker/`, ... from `elastic/` (as the architecture page's tables name modules);
# `policy/`, `rendezvous/`, `group/`, ... from `elastic/driver/` or `elastic/worker/` (as
# the package docstrings and the old walk do). The names do not overlap.
BASES: dict[str, Path] = {
    "elastic": ROOT,
    "tests": ROOT,
    "bench": ROOT,
    **_subpackages(PACKAGE),
    **_subpackages(PACKAGE / "driver"),
    **_subpackages(PACKAGE / "worker"),
}
# A file (any suffix) or a folder (its trailing slash) under one of those; not preceded by a
# path character, so `examples/elastic/...` is not the package's.
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, BASES)) + r")/[\w./-]*)")
# `elastic.x.y`: a module, or a module's attribute; not `hvd.elastic.run` (the facade's
# name) nor `horovod.torch.elastic`.
DOTTED = re.compile(r"(?<![\w.])(elastic(?:\.[A-Za-z_]\w*)+)")


def _manual_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _named_paths(text: str) -> set[str]:
    """The package paths `text` names: files (any suffix) and folders (a trailing slash)."""
    found = set()
    for match in PATH.findall(text):
        path = match.rstrip(".")  # a sentence's full stop
        if path.endswith("/") or re.search(r"\.\w+$", path):
            found.add(path)
    return found


# What a benchmark writes when it runs (ignored by git): named by the docs, not in a checkout.
RESULTS = "bench/results/"


def _path_exists(path: str) -> bool:
    if path.startswith(RESULTS):
        return True
    return (BASES[path.split("/", 1)[0]] / path).exists()


def _dotted_exists(name: str) -> bool:
    """Whether `name` is a module of the package, or an attribute of one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        value: object = importlib.import_module(module_name)
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_old_layout_blocks_say_so() -> None:
    """A block the path check skips is marked as the old layout in words too, so a reader
    knows its paths are not today's."""
    for page in _manual_pages():
        for block in OLD_LAYOUT.findall(page.read_text()):
            assert "before" in block.lower(), f"{page.name}: an old-layout block that says not"


def test_every_module_path_in_the_manual_exists() -> None:
    """Every `elastic/...` path, `driver/...`-style path (from `elastic/`) and `elastic.x.y`
    dotted name in the README and docs/ names a module, folder or attribute that exists,
    outside blocks marked as the old layout (`<!-- old-layout -->`)."""
    missing = []
    for page in _manual_pages():
        text = OLD_LAYOUT.sub("", page.read_text())
        where = page.relative_to(ROOT)
        missing += [f"{where}: {p}" for p in sorted(_named_paths(text)) if not _path_exists(p)]
        names = {n.rstrip(".") for n in DOTTED.findall(text)}
        missing += [f"{where}: {n}" for n in sorted(names) if not _dotted_exists(n)]
    assert missing == [], "the manual names modules that do not exist:\n" + "\n".join(missing)


def test_the_path_check_finds_what_it_should() -> None:
    """The check's patterns, on known text: what they take and what they leave."""
    text = (
        "`elastic/driver/conductor.py`, `driver/policy/forming.py` (`MAX`), `worker/group/`, "
        "`policy/rounds.py`, hvd.elastic.run, see examples/elastic/pytorch/x.py, "
        "`tests/e2e/`, driver/worker"
    )
    assert _named_paths(text) == {
        "elastic/driver/conductor.py",
        "driver/policy/forming.py",
        "worker/group/",
        "policy/rounds.py",
        "tests/e2e/",
    }
    assert DOTTED.findall("`elastic.torch`, hvd.elastic.run, horovod.torch.elastic") == [
        "elastic.torch"
    ]
    assert _dotted_exists("elastic.run_job") and _dotted_exists("elastic.driver.conductor")
    assert not _dotted_exists("elastic.worker.control")
    assert not _path_exists("worker/control.py") and _path_exists("elastic/worker/")
    assert not _path_exists("policy/rounds.py") and _path_exists("group/formation.py")
