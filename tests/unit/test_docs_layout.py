"""The documentation keeps up with the code: docs/layout.md's tree, and README.md's links.

docs/layout.md lists every module of `kernel_gateway/` in one fenced block whose first line
is `kernel_gateway/`, two spaces of indentation per level, folders ending with `/`, each
name followed by what it does (a description may go on over lines indented deeper than
its name). These tests read that block and compare it with the folder, so a module added,
moved or removed without the page fails here, naming what differs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kernel_gateway"
LAYOUT = ROOT / "docs" / "layout.md"
README = ROOT / "README.md"
README_MAX_LINES = 400

TREE_ROOT = "kernel_gateway/"
# A tree entry: a module (`name.py`) or a folder (`name/`); anything else on a line of the
# block is the description of the entry above it.
ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.py|/)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def tree_block(markdown: str) -> list[str]:
    """The lines of the first fenced block whose first line is `kernel_gateway/`."""
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if not line.startswith("```") or index + 1 >= len(lines):
            continue
        if lines[index + 1].strip() != TREE_ROOT:
            continue
        block: list[str] = []
        for inner in lines[index + 2 :]:
            if inner.startswith("```"):
                return block
            block.append(inner)
        raise AssertionError(f"{LAYOUT}: the `{TREE_ROOT}` code block is never closed")
    raise AssertionError(f"{LAYOUT}: no fenced code block starts with the line `{TREE_ROOT}`")


def listed_paths(block: list[str]) -> list[str]:
    """Every path the tree lists, relative to the package; folders end with `/`."""
    paths: list[str] = []
    folders: list[str] = []  # the folders enclosing the current line
    entry_indent = 0
    for number, line in enumerate(block, start=2):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        token = line.split()[0]
        if not ENTRY.fullmatch(token):
            if indent <= entry_indent:
                raise AssertionError(
                    f"{LAYOUT}, line {number} of the tree: {line.strip()!r} is neither a "
                    "module nor a folder, and not indented as the description of one"
                )
            continue
        if indent == 0 or indent % 2:
            raise AssertionError(
                f"{LAYOUT}, line {number} of the tree: {token!r} is indented by {indent} "
                "spaces; entries take two per level, starting at two"
            )
        depth = indent // 2 - 1
        if depth > len(folders):
            raise AssertionError(
                f"{LAYOUT}, line {number} of the tree: {token!r} is indented deeper than "
                "the folder above it allows"
            )
        del folders[depth:]
        paths.append("".join(folders) + token)
        if token.endswith("/"):
            folders.append(token)
        entry_indent = indent
    return paths


def package_paths() -> set[str]:
    """The modules (`__init__.py` aside) and folders under `kernel_gateway/`."""
    paths: set[str] = set()
    for module in PACKAGE.rglob("*.py"):
        relative = module.relative_to(PACKAGE)
        if "__pycache__" in relative.parts:
            continue
        # every folder that holds a module, at any depth, is a folder of the package
        for depth in range(1, len(relative.parts)):
            paths.add("/".join(relative.parts[:depth]) + "/")
        if module.name != "__init__.py":
            paths.add(relative.as_posix())
    return paths


def test_layout_tree_lists_every_module() -> None:
    listed = listed_paths(tree_block(LAYOUT.read_text(encoding="utf-8")))
    duplicates = sorted({path for path in listed if listed.count(path) > 1})
    actual = package_paths()
    missing = sorted(actual - set(listed))
    extra = sorted(set(listed) - actual)
    problems: list[str] = []
    if missing:
        problems.append(
            "missing from the page (they exist under kernel_gateway/):\n  " + "\n  ".join(missing)
        )
    if extra:
        problems.append(
            "listed on the page but not under kernel_gateway/:\n  " + "\n  ".join(extra)
        )
    if duplicates:
        problems.append("listed more than once:\n  " + "\n  ".join(duplicates))
    assert not problems, (
        "the tree in docs/layout.md does not match kernel_gateway/ (one line per module, "
        "two spaces per level, folders end with /)\n" + "\n".join(problems)
    )


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines; keep it under {README_MAX_LINES} and move reference "
        "material into docs/"
    )


def readme_links() -> list[str]:
    """Link and image targets in README.md, outside fenced code blocks."""
    targets: list[str] = []
    fenced = False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            targets += LINK.findall(line)
    return targets


def test_readme_links_into_docs_exist() -> None:
    into_docs = [
        target for target in readme_links() if target.removeprefix("./").startswith("docs/")
    ]
    assert into_docs, "README.md links to no page under docs/"
    broken = sorted(
        {
            target
            for target in into_docs
            if not (ROOT / target.split("#", 1)[0].removeprefix("./")).is_file()
        }
    )
    assert not broken, "README.md links to files that do not exist:\n  " + "\n  ".join(broken)
