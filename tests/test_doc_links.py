"""Every relative link in what a user reads (the README, the docs, the results, the scripts'
README) resolves: the file exists, relative to the linking file's folder, and an anchor into a
markdown file is one of its headings as GitHub writes them. Links in code are not links."""

import re
from pathlib import Path

import pytest

from tests.test_readme import anchors

ROOT = Path(__file__).parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "scripts" / "README.md",
             *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*.md"))]
    return [f for f in files if f.is_file()]


def broken_links(md: Path) -> list[str]:
    """The relative links of `md` that do not resolve, each with the reason."""
    text = CODE_SPAN.sub("", FENCE.sub("", md.read_text()))
    broken = []
    for link in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto: ...
            continue
        path, _, anchor = link.partition("#")
        target = (md.parent / path) if path else md
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no such heading in {target.name}")
    return broken


def test_the_check_finds_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A heading: `code`, (dated)\n")
    (tmp_path / "doc.md").write_text(
        "# Doc\n\n[ok](other.md) [ok](other.md#a-heading-code-dated) [ok](#doc)"
        " [web](https://example.com/x.md#nowhere) `[code](missing.md)`\n\n"
        "```bash\n# [in a fence](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [bad here](#nowhere)\n")
    assert broken_links(tmp_path / "doc.md") == [
        "missing.md: no such file", "other.md#nowhere: no such heading in other.md",
        "#nowhere: no such heading in doc.md"]


def test_the_files_are_found():
    names = {f.relative_to(ROOT).as_posix() for f in doc_files()}
    assert {"README.md", "docs/bench.md", "results/README.md"} <= names, names


@pytest.mark.parametrize("md", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(md):
    assert not broken_links(md), "\n".join(broken_links(md))
