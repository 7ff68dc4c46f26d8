"""Which fork template a stateless cell goes to: the light one, unless it may need more.

A fork server holds two templates (zygote.py): the light one has the light preload
(numpy and matplotlib by default) and forks cheaply; the full one has all of
`--preload` (pandas on top), which maps twice as many regions that every fork copies
and every exit tears down. A cell goes to the light template when the imports its text shows are all
of the standard library or the light preload (read with a regular expression: a few
microseconds on the event loop, where parsing would take a millisecond a page).

Only speed depends on this guess, never a result: a light child that imports pandas
after all (through a library, `pickle`, a file of the workspace) imports it then, as
any Python does (about 0.2 s). So the guess leans to the full template: a cell with
IPython syntax (`%` magics, `!` commands), an import by name at run time (`__import__`,
`importlib`, `exec`...), a relative import, or an `import` word it cannot tell from code
(in a string) goes there.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable

STANDARD = frozenset(sys.stdlib_module_names) - {
    "importlib",  # imports by name
    "pickle",  # unpickling imports the classes' modules (a pickled DataFrame: pandas)
    "pkgutil",
    "runpy",
    "shelve",
    "zipimport",
    "code",
    "codeop",
    "_pickle",
    "copyreg",
    "pydoc",  # pydoc.locate
    "unittest",
    "doctest",
}
"""Standard modules a light cell may import: none of them imports a third-party module,
except the ones taken out."""

MAX_CHARS = 20_000
"""Longer cells are not read (the scan runs on the event loop): the full template."""

IMPORT = re.compile(
    r"(?:^|;)[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import\b|import[ \t]+([^#\n;]*))", re.M
)
"""`from X import ...` (dots of a relative import, X) or `import A as B, C` (the list)."""

DYNAMIC = re.compile(
    r"__import__|import_module|(?<![\w.])(?:exec|eval|compile)[ \t]*\(|get_ipython|^[ \t]*[%!]",
    re.M,
)
"""What may import a module the text does not name, and IPython's own syntax."""

WORD = re.compile(r"\bimport\b")
"""The word left once every import the expression read is taken out: one it could not."""


def roots(modules: Iterable[str]) -> frozenset[str]:
    """The top-level packages of module names (`matplotlib.pyplot` is `matplotlib`)."""
    return frozenset(name.split(".")[0] for name in modules if name)


@functools.cache
def _allowed(light: frozenset[str]) -> frozenset[str]:
    """What a light cell may import, built once per light set (not per request)."""
    return STANDARD | light


def is_light(code: str, light: frozenset[str]) -> bool:
    """True if every import `code` shows is of a standard module or of a package in
    `light` (top-level names), and nothing in it may import by name at run time."""
    if len(code) > MAX_CHARS:
        return False
    code = code.replace("\r\n", "\n").replace("\r", "\n").replace("\\\n", " ")
    if DYNAMIC.search(code):
        return False
    allowed = _allowed(light)
    for match in IMPORT.finditer(code):
        dots, module, names = match.groups()
        if names is None:
            if dots or module.split(".")[0] not in allowed:
                return False
            continue
        for item in names.replace("(", " ").replace(")", " ").replace("\\", " ").split(","):
            words = item.split()
            if words and words[0].split(".")[0] not in allowed:
                return False
    return not WORD.search(IMPORT.sub("", code))  # no import it could not read
