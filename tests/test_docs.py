"""The manual documents every flag the launcher takes (on its flags page, docs/launcher.md)."""

from __future__ import annotations

from pathlib import Path

from elastic.driver.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
FLAGS_PAGE = ROOT / "docs" / "launcher.md"


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
