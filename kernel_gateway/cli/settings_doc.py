"""The settings tables of the docs, made from the declarations: `make docs-config`.

A page holds a table between `<!-- settings:NAME:begin -->` and `<!-- settings:NAME:end -->`,
NAME one of `TABLES`; everything else on the page is prose and is left alone.

    python -m kernel_gateway.cli.settings_doc            rewrite the tables of docs/*.md
    python -m kernel_gateway.cli.settings_doc --check    exit 1 naming the pages that are stale
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from kernel_gateway.cluster.settings import RouterSettings
from kernel_gateway.settings import Settings, markdown_table
from kernel_gateway.settings.client import McpSettings

TABLES: dict[str, type] = {"serve": Settings, "route": RouterSettings, "client": McpSettings}
"""The settings class of each table name: `serve`'s, the router's, and `run`'s and `mcp`'s."""
BLOCK = re.compile(
    r"(?P<begin><!-- settings:(?P<name>[a-z]+):begin -->\n)(?P<table>.*?)"
    r"(?P<end><!-- settings:(?P=name):end -->)",
    re.DOTALL,
)
REGENERATE = "python -m kernel_gateway.cli.settings_doc (or: make docs-config)"


def tables(text: str) -> dict[str, str]:
    """The tables a page holds, by name, as written."""
    return {m["name"]: m["table"] for m in BLOCK.finditer(text)}


def render(text: str) -> str:
    """The page with each of its tables made anew from the declarations."""

    def table(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"no settings table is called {name!r} (there are {list(TABLES)})")
        return match["begin"] + markdown_table(TABLES[name]) + match["end"]

    return BLOCK.sub(table, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernel_gateway.cli.settings_doc", description=__doc__.splitlines()[0]
    )
    parser.add_argument("pages", nargs="*", type=Path, help="pages (default: docs/*.md)")
    parser.add_argument("--check", action="store_true", help="only say which pages are stale")
    args = parser.parse_args(argv)
    stale = []
    for page in args.pages or sorted(Path("docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = render(text)
        if new == text:
            continue
        stale.append(page)
        if not args.check:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote the settings tables of {page}")
    if args.check and stale:
        names = ", ".join(map(str, stale))
        print(f"stale settings tables in {names}: run {REGENERATE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
