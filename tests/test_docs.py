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

ARCHITECTURE = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
MAX_ARCHITECTURE_LINES = 300
# The subsystem pages the architecture map links (docs/architecture/*.md).
ARCHITECTURE_PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "architecture", "*.md")))
# Where a path named by an architecture page may be rooted: the repository, the Python
# package, the op library and its core. A path with a folder must resolve against one of
# them; a bare file name must name a file of the repository.
PATH_ROOTS = ["", "python", "python/rec_sdk", "tf_ops", "tf_ops/core", "graph_rewrite"]
# Files of other projects the pages cite (TensorFlow's sources).
EXTERNAL_FILES = {
    "lookup_table_op.cc",
    "resource_variable_ops.cc",
    "__rec_sdk__/",
}  # (a key prefix, not a folder)
NAMED_PATH = re.compile(
    r"(?<![\w./<>-])((?:[A-Za-z_][\w.-]*/)*[A-Za-z_][\w-]*\.(?:py|cc|h|md|sh|toml))"
    r"(?![\w/])|(?<![\w./<>-])((?:[A-Za-z_][\w-]*/)+)(?=[\s`),;:]|$)"
)

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def markdown_files():
    files = [README, os.path.join(ROOT, "benchmarks", "RESULTS.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    files += ARCHITECTURE_PAGES
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
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
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
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        yield number, target


def test_readme_is_short():
    with open(README, encoding="utf-8") as f:
        count = len(f.read().splitlines())
    assert count < MAX_README_LINES, "README.md has %d lines" % count


def test_slug_follows_github():
    assert (
        slug("Tables larger than memory (the SSD level)")
        == "tables-larger-than-memory-the-ssd-level"
    )
    assert (
        slug("Peers: TorchRec/FBGEMM and TFRA beside rec_sdk (`benchmarks/bench_peers.py`)")
        == "peers-torchrecfbgemm-and-tfra-beside-rec_sdk-benchmarksbench_peerspy"
    )
    assert (
        slug("Across processes: the SDK API over ranks")
        == "across-processes-the-sdk-api-over-ranks"
    )


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(path):
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        where = "%s:%d: %s" % (os.path.relpath(path, ROOT), number, target)
        resolved = (
            os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        )
        if not os.path.exists(resolved):
            broken.append(where + " (no such file)")
            continue
        if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(where + " (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_links_every_guide():
    linked = {
        os.path.normpath(os.path.join(ROOT, target.partition("#")[0]))
        for _, target in relative_links(README)
    }
    missing = [g for g in GUIDES if os.path.join(ROOT, g) not in linked]
    absent = [g for g in GUIDES if not os.path.exists(os.path.join(ROOT, g))]
    assert not missing, "README.md does not link: %s" % missing
    assert not absent, "guides missing: %s" % absent


def test_every_statement_of_the_rank_semantics_names_an_existing_test():
    """docs/DISTRIBUTED.md's "What is synchronous" list: each statement names the tests that
    check it, and those tests exist."""
    with open(os.path.join(ROOT, "docs", "DISTRIBUTED.md")) as f:
        text = f.read()
    section = text[text.index("### What is synchronous") :]
    section = section[: section.index("\n#", 1)]
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


def test_architecture_is_a_short_map_of_its_pages():
    """docs/ARCHITECTURE.md stays a map (the layer table and the folders) of at most 300
    lines that links every subsystem page, and every page links back to it."""
    with open(ARCHITECTURE, encoding="utf-8") as f:
        count = len(f.read().splitlines())
    assert count <= MAX_ARCHITECTURE_LINES, "docs/ARCHITECTURE.md has %d lines" % count
    assert len(ARCHITECTURE_PAGES) >= 6, ARCHITECTURE_PAGES
    linked = {
        os.path.normpath(os.path.join(os.path.dirname(ARCHITECTURE), t.partition("#")[0]))
        for _, t in relative_links(ARCHITECTURE)
    }
    assert not [p for p in ARCHITECTURE_PAGES if p not in linked], "pages the map does not link"
    for page in ARCHITECTURE_PAGES:
        back = {
            os.path.normpath(os.path.join(os.path.dirname(page), t.partition("#")[0]))
            for _, t in relative_links(page)
        }
        assert ARCHITECTURE in back, "%s does not link the map" % page


def _repository_files():
    names = set()
    for _directory, dirs, files in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith((".", "bazel-")) and d not in ("build", "dist", "__pycache__")
        ]
        names.update(files)
    return names


def named_paths(path):
    """(line number, path) of the file and folder paths an architecture page names."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f.read().splitlines(), 1):
            for match in NAMED_PATH.finditer(line.replace("](", "] (")):
                name = match.group(1) or match.group(2)
                if (
                    "*" not in name
                    and name not in EXTERNAL_FILES
                    and "://" not in line[max(0, match.start() - 8) : match.start()]
                ):
                    yield number, name


@pytest.mark.parametrize(
    "path", [ARCHITECTURE] + ARCHITECTURE_PAGES, ids=lambda p: os.path.relpath(p, ROOT)
)
def test_architecture_pages_name_existing_files(path):
    """Every path an architecture page names exists: a path with a folder under one of
    PATH_ROOTS (or the page's own folder), a bare file name somewhere in the repository."""
    files = _repository_files()
    missing = []
    for number, name in named_paths(path):
        roots = PATH_ROOTS + [os.path.relpath(os.path.dirname(path), ROOT)]
        if "/" in name.rstrip("/"):
            found = any(os.path.exists(os.path.join(ROOT, r, name)) for r in roots)
        else:
            found = (
                name.rstrip("/") in files
                or any(os.path.isdir(os.path.join(ROOT, r, name)) for r in roots)
                or name.endswith("/")
                and any(name.rstrip("/") in d for d in files)
            )
        if not found:
            missing.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, name))
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_path_check_finds_a_stale_path(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see `core/ranks.py` and util/cluster.py, and tables/table.py\n")
    assert [n for _, n in named_paths(str(page))] == [
        "core/ranks.py",
        "util/cluster.py",
        "tables/table.py",
    ]
