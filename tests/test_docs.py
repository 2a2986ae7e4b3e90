"""The README documents every flag the launcher takes."""

from __future__ import annotations

from pathlib import Path

from elastic.driver.cli.main import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_launcher_flag_is_in_the_readme() -> None:
    text = README.read_text()
    flags = [
        option
        for action in build_parser()._actions  # argparse keeps no public list of them
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert len(flags) > 30
    missing = [flag for flag in flags if f"`{flag}" not in text]
    assert missing == [], f"flags missing from README.md: {missing}"
