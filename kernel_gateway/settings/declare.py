"""How a setting is declared once, and everything generated from that declaration.

A settings class is a frozen dataclass whose every field is made by `setting(...)`:

    port: int = setting(8888, "port to listen on", minimum=0, maximum=65535)

The field's name gives its flag (`--port`) and its environment variable (`KG_PORT`); its
annotation gives how their text is read (`int`, `float`, `bool`, `Path`, `str`, `X | None`);
the declaration gives the help, the doc text, the bounds and the default. From these come:

- `add_arguments`: the argparse flags (each defaults to None, so the variable can fill it);
- `env_values`: the `KG_*` variables read and converted;
- `check_fields`: every field's bounds, checked in `__post_init__` (relations between
  fields stay in the class, as code);
- `markdown_table`: the table of the configuration page (`python -m
  kernel_gateway.cli.settings_doc` writes it between the page's markers).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict, TypeVar, Unpack, overload

T = TypeVar("T")
SPEC = "kernel_gateway.setting"
"""The key of a field's `Spec` in its dataclass metadata."""


class Rules(TypedDict, total=False):
    """What a declaration may say besides its default and help (see `Spec`)."""

    doc: str
    default_doc: str
    choices: tuple[str, ...]
    minimum: float
    maximum: float
    positive: bool
    finite: bool
    check: Callable[[Any], object]
    metavar: str


@dataclass(frozen=True)
class Spec:
    """One setting's declaration, apart from its name, type and default (the field's)."""

    help: str
    """One line for `--help` (the default and the variable are added to it)."""
    doc: str = ""
    """The configuration page's text (markdown); `help` when empty."""
    default_doc: str = ""
    """The default in words (markdown), where it is computed or a number says too little."""
    choices: tuple[str, ...] = ()
    """The values the flag offers; a value must be one of them, unless `check` decides."""
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False
    """A finite number > 0 (durations, counts of seconds)."""
    finite: bool = False
    """A finite number (with `minimum`: >= it)."""
    check: Callable[[Any], object] | None = None
    """Raises ValueError (its message says what is wrong) when the value is not allowed:
    `parse_size` for sizes, a list's parser for lists."""
    metavar: str | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value`, or None."""
        if value is None:
            return None
        if self.choices and self.check is None and value not in self.choices:
            return f"must be one of {', '.join(self.choices)} (got {value!r})"
        if self.positive and not (math.isfinite(value) and value > 0):
            return f"must be a finite number > 0 (got {value})"
        if self.finite and not math.isfinite(value):
            bound = "" if self.minimum is None else f" >= {self.minimum:g}"
            return f"must be a finite number{bound} (got {value})"
        low, high = self.minimum, self.maximum
        if low is not None and high is not None and not low <= value <= high:
            return f"must be between {low:g} and {high:g} (got {value})"
        if low is not None and value < low:
            return f"must be >= {low:g} (got {value})"
        if high is not None and value > high:
            return f"must be <= {high:g} (got {value})"
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                return str(exc)
        return None


@overload
def setting(default: T, help: str, **rules: Unpack[Rules]) -> T: ...
@overload
def setting(*, factory: Callable[[], T], help: str, **rules: Unpack[Rules]) -> T: ...
def setting(
    default: Any = MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    **rules: Unpack[Rules],
) -> Any:
    """A settings field: its default (or a `factory` computing it) and its declaration."""
    if not help:
        raise TypeError("a setting needs a help text")
    spec = Spec(help=help, **rules)
    if factory is not None:
        if not spec.default_doc:
            raise TypeError("a computed default needs default_doc, its description")
        return field(default_factory=factory, metadata={SPEC: spec})
    return field(default=default, metadata={SPEC: spec})


def declared(settings_class: type) -> Iterator[tuple[Field[Any], Spec]]:
    """Every field of a settings class with its declaration, in declaration order."""
    for f in fields(settings_class):
        spec = f.metadata.get(SPEC)
        if not isinstance(spec, Spec):
            raise TypeError(f"{settings_class.__name__}.{f.name} is not declared by setting()")
        yield f, spec


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def variable(name: str) -> str:
    return "KG_" + name.upper()


def origin(name: str) -> str:
    """How a user sets a field, for error messages: `--memory-limit (KG_MEMORY_LIMIT)`."""
    return f"{flag(name)} ({variable(name)})"


def check_fields(settings: object) -> None:
    """Every field's declared bounds; ValueError naming the flag for the first one broken."""
    for f, spec in declared(type(settings)):
        problem = spec.problem(getattr(settings, f.name))
        if problem is not None:
            raise ValueError(f"{origin(f.name)}: {problem}")


def describe(settings: object) -> list[str]:
    """Settings as log lines, `name=value`, with the token masked."""
    out = []
    for f, _ in declared(type(settings)):
        value = getattr(settings, f.name)
        if f.name == "token" and value:
            value = "***"
        out.append(f"{f.name}={value}")
    return out


# -- the environment --------------------------------------------------------------------


def convert(kind: str, raw: str) -> Any:
    """A `KG_*` variable's text as a value of a settings field's type (its annotation)."""
    if kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"must be a boolean (got {raw!r})")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "Path":
        return Path(raw)
    if kind == "str | None":
        return raw or None
    if kind == "Path | None":
        return Path(raw) if raw else None
    return raw


def env_values(
    settings_class: type, environ: Mapping[str, str], names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The fields of a settings class that `KG_*` variables set (only `names`, if given),
    converted."""
    values: dict[str, Any] = {}
    for f, _ in declared(settings_class):
        raw = environ.get(variable(f.name))
        if raw is None or (names and f.name not in names):
            continue
        try:
            values[f.name] = convert(str(f.type), raw)
        except ValueError as exc:
            raise ValueError(f"{variable(f.name)}: {exc}") from None
    return values


def flag_values(settings_class: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields that flags set (a flag not given is None, left to its variable)."""
    names = {f.name for f in fields(settings_class)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


# -- argparse ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, settings_class: type) -> None:
    """A flag per field; each defaults to None so that its `KG_*` twin can fill it."""
    for f, spec in declared(settings_class):
        kind = str(f.type)
        text = f"{plain(spec.help)} ({variable(f.name)}; default: {plain(default_text(f, spec))})"
        options: dict[str, Any] = {"help": text.replace("%", "%%")}
        if kind == "bool":
            options.update(action="store_const", const=True)
        else:
            options["type"] = {"int": int, "float": float}.get(kind.removesuffix(" | None"))
            if "Path" in kind:
                options["type"] = Path
            if spec.choices:
                options["choices"] = spec.choices
            if spec.metavar:
                options["metavar"] = spec.metavar
        parser.add_argument(flag(f.name), **options)


# -- the configuration page -------------------------------------------------------------


def default_text(f: Field[Any], spec: Spec) -> str:
    """The default as the page shows it (markdown)."""
    if spec.default_doc:
        return spec.default_doc
    value = f.default
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = f"`{value}`"
    if isinstance(value, int) and f.name.endswith("_bytes") and value >= 1024:
        text += f" ({binary_size(value)})"
    return text


def binary_size(n: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = 1024 ** ("KMGT".index(unit[0]) + 1)
        if n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def plain(markdown: str) -> str:
    """Markdown text for a terminal: without backticks."""
    return markdown.replace("`", "")


def markdown_table(settings_class: type) -> str:
    """The configuration page's table of a settings class: flag, variable, default, meaning."""
    lines = ["| flag | variable | default | meaning |", "|---|---|---|---|"]
    for f, spec in declared(settings_class):
        cells = (
            f"`{flag(f.name)}`",
            f"`{variable(f.name)}`",
            default_text(f, spec),
            spec.doc or spec.help,
        )
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
