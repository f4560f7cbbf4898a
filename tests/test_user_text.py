"""What a user reads speaks a user's language: no issue numbers, "item N" or "change N" of the
project's own bookkeeping, and no acceptance wording, in the README, the docs, the results, the
shipped configs, the scripts (their docstrings are their --help) and the command line's help."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BOOKKEEPING = re.compile(r"(?i)\b(issues?|items?|change) #?\d+\b|\(#\d+\)|"
                         r"\bnothing may be chosen\b|"
                         r"\(\s*[≤≥<>]=? ?[\d.]+ asked\)|\(\d+ asked\)")


def user_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "scripts" / "README.md",
             *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*.md")),
             *sorted((ROOT / "configs").rglob("*.yaml")),
             *sorted((ROOT / "scripts").rglob("*.py")),
             *sorted((ROOT / "fbnas/_cli").rglob("*.py"))]
    return [f for f in files if f.is_file()]


def test_the_pattern_catches_what_it_is_for():
    for text in ("(issue 51, item 2)", "change 3's settings", "Issue 26 asked", "(#12)",
                 "nothing may be chosen on it", "(≤ 1 asked)", "(9 asked)"):
        assert BOOKKEEPING.search(text), text
    for text in ("a changed setting", "3 items", "the issue is speed", "the fit changes 3 layers"):
        assert not BOOKKEEPING.search(text), text


@pytest.mark.parametrize("path", user_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bookkeeping_in_what_a_user_reads(path):
    hits = [f"{path.relative_to(ROOT)}:{i}: {m.group(0)!r}"
            for i, line in enumerate(path.read_text().splitlines(), 1)
            for m in [BOOKKEEPING.search(line)] if m]
    assert not hits, "\n".join(hits)


def test_no_bookkeeping_in_the_command_line_help():
    out = subprocess.run([sys.executable, "-m", "fbnas", "--help"], capture_output=True,
                         text=True, timeout=120).stdout
    assert "COMMAND" in out and not BOOKKEEPING.search(out), out
