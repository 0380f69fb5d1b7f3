"""The documentation's shape: the README stays short, and every relative link in the README
and in docs/ (and benchmarks/RESULTS.md) points to a file that exists and, for a `#anchor`
into a Markdown file, to a heading of that file (GitHub's anchor rules). Pure Python: no
TensorFlow, no rec_sdk import.
"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MAX_README_LINES = 300

# The guides the README's "Guides" list must link, one per topic.
GUIDES = [
    "docs/INSTALL.md",
    "docs/PORTING_SDK.md",
    "docs/PORTING_TFRA.md",
    "docs/DISTRIBUTED.md",
    "docs/TIERED.md",
    "docs/SERVING.md",
    "docs/PERFORMANCE.md",
    "docs/STATUS.md",
    "docs/API.md",
]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def markdown_files():
    files = [README, os.path.join(ROOT, "benchmarks", "RESULTS.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [f for f in files if os.path.exists(f)]


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    in_fence = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading: the rendered text lowercased, punctuation other than
    hyphens and underscores dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link renders as its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    result = set()
    for _, line in prose_lines(path):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else "%s-%d" % (base, count))
    return result


def links(path):
    """(line number, target) of every Markdown link outside code."""
    for number, line in prose_lines(path):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(2)


def relative_links(path):
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:
            continue
        yield number, target


def test_readme_is_short():
    with open(README, encoding="utf-8") as f:
        count = len(f.read().splitlines())
    assert count < MAX_README_LINES, "README.md has %d lines" % count


def test_slug_follows_github():
    assert slug("Tables larger than memory (the SSD level)") == \
        "tables-larger-than-memory-the-ssd-level"
    assert slug("Peers: TorchRec/FBGEMM and TFRA beside rec_sdk (`benchmarks/bench_peers.py`)") \
        == "peers-torchrecfbgemm-and-tfra-beside-rec_sdk-benchmarksbench_peerspy"
    assert slug("Across processes: the SDK API over ranks") == \
        "across-processes-the-sdk-api-over-ranks"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(path):
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        where = "%s:%d: %s" % (os.path.relpath(path, ROOT), number, target)
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        if not os.path.exists(resolved):
            broken.append(where + " (no such file)")
            continue
        if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(where + " (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_links_every_guide():
    linked = {os.path.normpath(os.path.join(ROOT, target.partition("#")[0]))
              for _, target in relative_links(README)}
    missing = [g for g in GUIDES if os.path.join(ROOT, g) not in linked]
    absent = [g for g in GUIDES if not os.path.exists(os.path.join(ROOT, g))]
    assert not missing, "README.md does not link: %s" % missing
    assert not absent, "guides missing: %s" % absent


def test_every_statement_of_the_rank_semantics_names_an_existing_test():
    """docs/DISTRIBUTED.md's "What is synchronous" list: each statement names the tests that
    check it, and those tests exist."""
    with open(os.path.join(ROOT, "docs", "DISTRIBUTED.md")) as f:
        text = f.read()
    section = text[text.index("### What is synchronous"):]
    section = section[:section.index("\n#", 1)]
    statements = [s for s in section.split("\n* ")[1:]]
    assert len(statements) >= 7
    sources = ""
    for name in os.listdir(os.path.join(ROOT, "tests")):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(ROOT, "tests", name)) as f:
                sources += f.read()
    for statement in statements:
        named = re.findall(r"`(test_\w+)`", statement)
        assert named, statement
        for test in named:
            assert "def %s(" % test in sources, test
