"""The README is the front door: what fbnas is first, then the install, test and quickstart
commands, at most 100 lines, and every link it holds (files, headings, the picture) resolves."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def slug(heading: str) -> str:
    """A markdown heading's anchor as GitHub writes it."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", md.read_text(), re.M)}


def test_what_fbnas_is_comes_first_then_the_three_commands():
    lines = README.splitlines()
    assert len(lines) <= 100, len(lines)
    assert lines[0] == "# fbnas"
    first_code = README.index("```")
    assert "fbnas is a PyTorch framework" in README[:first_code]
    block = README[first_code:README.index("```", first_code + 3)]
    commands = [ln.split("#")[0].strip() for ln in block.splitlines()[1:] if ln.strip()]
    assert commands == ['pip install -e ".[dev]"', "python -m pytest -q",
                        "fbnas train --config quickstart"]


def test_every_link_resolves():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert len(links) >= 15
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            assert anchor in anchors(target), link


def test_the_slug_is_githubs():
    assert slug("2026-11-29: `search.budget` on the quickstart") == \
        "2026-11-29-searchbudget-on-the-quickstart"
    assert slug("The held-out duel (2026-11-28/29; 12 pairs): not shown") == \
        "the-held-out-duel-2026-11-2829-12-pairs-not-shown"
