"""Reading a Dockerfile: its lines, continuations, directives, heredocs and words, and
the variables (`ARG`, `ENV`) substituted in them, as Docker reads them. `dockerfile.py`
turns what is read into a template's steps.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from kernel_gateway.errors import InvalidRequest

HEREDOC_INSTRUCTIONS = frozenset({"RUN", "COPY", "ADD"})
CONTINUATION = re.compile(r"([^\\])\\[ \t]*$|^\\[ \t]*$")
DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
HEREDOC_MARKER = re.compile(r"([0-9]*)<<(-?)[ \t\r]*([^<]+)", re.DOTALL)
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
SHOWN_CHARS = 200
MAX_NESTING = 20
"""`${a:-${b:-...}}` levels: a bound on the lexer's recursion."""


def refusal(line: int, keyword: str, exc: Refused) -> InvalidRequest:
    """`Dockerfile line 3: ADD from a URL...`: the line, and the instruction first."""
    message = str(exc)
    if not message.startswith(keyword):
        message = f"{keyword}: {message}"
    return InvalidRequest(f"Dockerfile line {line}: {message}")


class Refused(Exception):
    """A reason an instruction cannot be taken; the caller adds its line."""


@dataclass(frozen=True)
class Heredoc:
    name: str
    body: str
    """The lines between the marker and the terminator, each with its newline."""
    chomp: bool
    """`<<-`: the body's leading tabs go."""

    def content(self) -> str:
        return re.sub(r"^\t+", "", self.body, flags=re.MULTILINE) if self.chomp else self.body


@dataclass(frozen=True)
class Instruction:
    line: int
    """The line it starts on, from 1."""
    keyword: str
    """Upper-cased: `RUN`."""
    text: str
    """All after the keyword, continuation lines joined."""
    flags: tuple[str, ...]
    """The leading `--name=value` words, as written."""
    rest: str
    """The text after the flags."""
    heredocs: tuple[Heredoc, ...] = ()

    def shown(self) -> str:
        return f"{self.keyword} {self.text}".strip()[:SHOWN_CHARS]


def read_instructions(text: str) -> list[Instruction]:
    """The instructions, comments and continuations gone, heredoc bodies collected."""
    lines = [line.removesuffix("\r") for line in text.removeprefix("\ufeff").split("\n")]
    check_directives(lines)
    instructions: list[Instruction] = []
    index = 0
    while index < len(lines):
        start = index
        logical, index = join_continued(lines, index)
        if not logical.strip():
            continue
        instruction = split_instruction(start + 1, logical)
        if instruction.keyword in HEREDOC_INSTRUCTIONS and "<<" in logical:
            try:
                instruction, index = with_heredocs(instruction, logical, lines, index)
            except Refused as exc:
                raise refusal(instruction.line, instruction.keyword, exc) from None
        instructions.append(instruction)
    return instructions


def check_directives(lines: list[str]) -> None:
    """`# syntax=` and `# check=` are comments here; `# escape=` would change the text."""
    for number, line in enumerate(lines, 1):
        match = DIRECTIVE.match(line)
        if match is None:
            return
        if match.group(1).lower() == "escape" and match.group(2) != "\\":
            raise InvalidRequest(f"Dockerfile line {number}: the escape directive is not supported")


def join_continued(lines: list[str], index: int) -> tuple[str, int]:
    """The logical line starting at `index` (comment lines are empty), and the next index."""
    line = lines[index].lstrip()
    index += 1
    if line.startswith("#"):
        return "", index
    first, ended = trim_continuation(line)
    parts = [first]
    while not ended and index < len(lines):
        raw = lines[index]
        index += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue  # Docker skips these inside a continuation
        part, ended = trim_continuation(raw)
        parts.append(part)
    return "".join(parts), index


def trim_continuation(line: str) -> tuple[str, bool]:
    """The line without its trailing `\\`, and whether the instruction ends here."""
    if CONTINUATION.search(line):
        return CONTINUATION.sub(r"\1", line), False
    return line, True


def split_instruction(number: int, logical: str) -> Instruction:
    keyword, *more = logical.split(maxsplit=1)
    text = more[0].strip() if more else ""
    flags, rest = take_flags(text)
    return Instruction(number, keyword.upper(), text, tuple(flags), rest)


def take_flags(text: str) -> tuple[list[str], str]:
    """The leading `--flag[=value]` words and what follows them (`--` ends the flags)."""
    flags: list[str] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not text.startswith("--", pos):
            break
        word, pos = next_word(text, pos)
        if word == "--":
            break
        flags.append(word)
    return flags, text[pos:].strip()


def with_heredocs(
    instruction: Instruction, logical: str, lines: list[str], index: int
) -> tuple[Instruction, int]:
    """The instruction with the bodies of its `<<NAME` heredocs, read from `index` on."""
    if json_array(instruction.rest) is not None:
        return instruction, index
    heredocs: list[Heredoc] = []
    for word in raw_words(logical, heredoc=True):
        marker = heredoc_marker(word)
        if marker is None:
            continue
        name, chomp = marker
        body: list[str] = []
        while True:
            if index >= len(lines):
                raise Refused(f"the heredoc <<{name} has no end")
            line = lines[index]
            index += 1
            if (line.lstrip("\t") if chomp else line) == name:
                break
            body.append(line + "\n")
        heredocs.append(Heredoc(name, "".join(body), chomp))
    return replace(instruction, heredocs=tuple(heredocs)), index


def heredoc_marker(word: str) -> tuple[str, bool] | None:
    """`<<EOF`, `<<-"EOF"`, `2<<EOF` -> (the terminator, whether `<<-`), as BuildKit."""
    match = HEREDOC_MARKER.fullmatch(word)
    if match is None or len(raw_words(match.group(3))) != 1:
        return None
    try:
        name = Lexer(match.group(3).strip(), {}, keep_unset=True).word()
    except Refused:
        return None
    return (name, match.group(2) == "-") if name else None


def next_word(text: str, pos: int, heredoc: bool = False) -> tuple[str, int]:
    """The whitespace-delimited word at `pos` (after spaces), quotes and escapes kept."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    out: list[str] = []
    quote = ""
    while pos < len(text):
        ch = text[pos]
        if ch == "\\" and quote != "'":
            out.append(text[pos : pos + 2])
            pos += 2
            continue
        if quote:
            quote = "" if ch == quote else quote
        elif ch.isspace():
            break
        elif ch in "'\"":
            quote = ch
        elif heredoc and text.startswith("<<", pos):
            end = pos + 2  # BuildKit keeps `<< EOF` one word
            while end < len(text) and text[end] in " \t\r":
                end += 1
            out.append(text[pos:end])
            pos = end
            continue
        out.append(ch)
        pos += 1
    return "".join(out), pos


def raw_words(text: str, heredoc: bool = False) -> list[str]:
    words: list[str] = []
    pos = 0
    while True:
        word, pos = next_word(text, pos, heredoc)
        if not word:
            return words
        words.append(word)


def json_array(rest: str) -> list[str] | None:
    """The words of an exec-form `["a", "b"]`, or None for the shell form."""
    if not rest.startswith("["):
        return None
    try:
        parsed = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(parsed, list):
        return None
    if not all(isinstance(item, str) for item in parsed):
        raise Refused("a JSON (exec form) array holds only strings")
    return parsed


# Words: quotes, escapes and variables.


class Lexer:
    """One word as Docker's shell lexer reads it: quotes and escapes removed, `$name`
    replaced from `env`; one not in `env` kept as written (`keep_unset`, unless it is
    one of the names known to be `unset`) or empty."""

    def __init__(
        self,
        text: str,
        env: Mapping[str, str],
        keep_unset: bool,
        unset: AbstractSet[str] = frozenset(),
    ) -> None:
        self.text = text
        self.pos = 0
        self.env = env
        self.keep_unset = keep_unset
        self.unset = unset
        self.depth = 0

    def word(self, stop: str | None = None) -> str:
        out: list[str] = []
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == stop:
                self.pos += 1
                return "".join(out)
            if ch == "$":
                out.append(self.dollar())
            elif ch == "'":
                out.append(self.single_quoted())
            elif ch == '"':
                out.append(self.double_quoted())
            elif ch == "\\":  # escapes the next character (one at the end goes)
                out.append(text[self.pos + 1 : self.pos + 2])
                self.pos += 2
            else:
                out.append(ch)
                self.pos += 1
        if stop is not None:
            raise Refused(f"a {stop!r} is missing in {text!r}")
        return "".join(out)

    def single_quoted(self) -> str:
        end = self.text.find("'", self.pos + 1)
        if end < 0:
            raise Refused(f"a closing ' is missing in {self.text!r}")
        quoted = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return quoted

    def double_quoted(self) -> str:
        out: list[str] = []
        self.pos += 1
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == '"':
                self.pos += 1
                return "".join(out)
            if ch == "$":
                out.append(self.dollar())
                continue
            following = self.text[self.pos + 1 : self.pos + 2]
            if ch == "\\" and following in ('"', "$", "\\"):
                ch = following
                self.pos += 1
            out.append(ch)
            self.pos += 1
        raise Refused(f'a closing " is missing in {self.text!r}')

    def dollar(self) -> str:
        self.pos += 1
        if self.text.startswith("{", self.pos):
            self.pos += 1
            return self.braced()
        match = VARIABLE.match(self.text, self.pos)
        if match is None:
            return "$"
        self.pos = match.end()
        return self.value(match.group(0), "$" + match.group(0))

    def braced(self) -> str:
        """After `${`: `name}`, or `name` and a modifier `-`, `+`, `?` (`:` before one)."""
        match = VARIABLE.match(self.text, self.pos)
        if match is None:
            raise Refused(f"a bad substitution in {self.text!r}")
        name = match.group(0)
        self.pos = match.end()
        modifier = self.text[self.pos : self.pos + 1]
        if modifier == "}":
            self.pos += 1
            return self.value(name, "${" + name + "}")
        if modifier == ":":
            modifier = self.text[self.pos : self.pos + 2]
        if modifier[-1:] not in ("-", "+", "?"):
            raise Refused(f"${{{name}{modifier}...}} is not a supported substitution")
        self.pos += len(modifier)
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise Refused(f"substitutions nest over {MAX_NESTING} deep")
        word = self.word("}")
        self.depth -= 1
        value = self.env.get(name)
        if value is None and self.kept(name):
            return "${" + name + modifier + word + "}"
        unset = value is None or (modifier.startswith(":") and not value)
        if modifier.endswith("-"):
            return word if unset else value or ""
        if modifier.endswith("+"):
            return "" if unset else word
        if unset:
            raise Refused(f"{name}: {word or 'is not set'}")
        return value or ""

    def value(self, name: str, written: str) -> str:
        value = self.env.get(name)
        if value is None:
            return written if self.kept(name) else ""
        return value

    def kept(self, name: str) -> bool:
        return self.keep_unset and name not in self.unset


def shell_join(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


# Converting: instructions to steps.
