"""Where the files a test runs are in the checkout, named once, so that a test's own place under
tests/ does not matter: the repository's root, the worker scripts (tests/support/workers), the
bundled discovery scripts and the shipped examples."""

from __future__ import annotations

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parent / "workers"
DISCOVERY_SCRIPTS = REPOSITORY / "discovery_scripts"
EXAMPLES = REPOSITORY / "examples"
