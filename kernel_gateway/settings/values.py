"""What a setting's text may be: sizes, lists of names, tokens; and who may listen where.

Each parser raises ValueError saying what is wrong with the text; `declare.check_fields`
puts the flag's name in front (`--memory-limit (KG_MEMORY_LIMIT): 'lots' is not a size`).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kernel_gateway.in_proxy.policy import BadPattern, normalize
from kernel_gateway.settings.declare import origin

LANGUAGE_NAME = re.compile(r"[a-z][a-z0-9_+-]{0,31}")
# A node's name in a cluster: it prefixes the ids of the sessions made there (`<node>.<hex>`).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
FIGURE_FORMATS = frozenset({"png", "retina", "jpeg", "svg", "pdf"})
MIN_MEMORY_LIMIT = 6 * 1024**2  # Docker refuses a smaller --memory
LOG_LEVELS = ("debug", "info", "warning", "error")
"""What `--log-level` offers; its variable may also name another level `logging` knows."""


def parse_size(text: str) -> int:
    """Bytes from a size: plain bytes, or 512m, 1g, 1G, 1GiB, 1gb, 1024k (binary units)."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    raw = text
    text = text.strip().lower()
    for suffix in ("ib", "b"):
        if text.endswith(suffix) and text[: -len(suffix)][-1:] in units:
            text = text.removesuffix(suffix)
            break
    try:
        if text and text[-1] in units:
            value = float(text[:-1]) * units[text[-1]]
        else:
            value = float(text.removesuffix("b"))
    except ValueError:
        raise ValueError(f"{raw!r} is not a size (examples: 512m, 1g, 1GiB, 1048576)") from None
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError(f"{raw!r} is not a positive size")
    return int(value)


def memory_size(text: str) -> int:
    """A kernel container's memory limit: a size Docker accepts."""
    size = parse_size(text)
    if size < MIN_MEMORY_LIMIT:
        raise ValueError(
            f"{text!r} is below Docker's minimum of 6 MiB (and far below what a kernel needs; "
            "the default is 1g)"
        )
    return size


def items(text: str) -> list[str]:
    """A comma-separated list's items, stripped, empty ones left out."""
    return [item.strip() for item in text.split(",") if item.strip()]


def module_names(text: str) -> list[str]:
    modules = items(text)
    for module in modules:
        if not all(part.isidentifier() for part in module.split(".")):
            raise ValueError(f"{module!r} is not a module name")
    return modules


def figure_formats(text: str) -> list[str]:
    formats = items(text)
    if not formats or set(formats) - FIGURE_FORMATS:
        raise ValueError(f"must list some of {', '.join(sorted(FIGURE_FORMATS))} (got {text!r})")
    return formats


def language_names(text: str) -> list[str] | None:
    """The languages asked for by name (python always among them), or None for `auto`."""
    if text.strip() in ("", "auto"):
        return None
    names = [n.lower() for n in items(text)]
    for name in names:
        if not LANGUAGE_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a language name")
    return names if "python" in names else ["python", *names]


def language_pool(text: str) -> dict[str, int]:
    """Warm kernels per language other than Python: `r=1,javascript=2`."""
    sizes: dict[str, int] = {}
    for item in items(text):
        name, sep, count = item.partition("=")
        name = name.strip().lower()
        if not sep or not LANGUAGE_NAME.fullmatch(name) or not count.strip().isdigit():
            raise ValueError(
                f"expected LANGUAGE=COUNT[,...] such as r=1,javascript=2 (got {item!r})"
            )
        sizes[name] = int(count)
    if "python" in sizes:
        raise ValueError(f"Python's warm kernels are set by {origin('pool_size')}")
    return sizes


def domain_patterns(text: str) -> list[str]:
    """Domain patterns (`pypi.org,*.pythonhosted.org`) in their one spelling."""
    try:
        return [normalize(p) for p in text.split(",") if p.strip()]
    except BadPattern as exc:
        raise ValueError(str(exc)) from None


def node_name(text: str) -> str:
    if not NODE_NAME.fullmatch(text):
        raise ValueError(
            f"1-63 letters, digits, '-' or '_', starting with a letter or digit (got {text!r})"
        )
    return text


def http_url(text: str) -> str:
    """An http(s) URL with a host (a model API's base URL); anything else refused at once."""
    parsed = urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"an http:// or https:// URL with a host (got {text!r})")
    return text


def log_level(text: str) -> str:
    """A level `logging` knows, in any case: `KG_LOG_LEVEL=DEBUG` or `critical` work as they
    always did (and `trace` once uvicorn has named it); anything else is refused at once."""
    if isinstance(logging.getLevelName(text.upper()), int):
        return text
    raise ValueError(f"must be one of {', '.join(LOG_LEVELS)} (got {text!r})")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, no_auth: bool) -> None:
    """Refuse to serve code execution (a gateway, or a router in front of gateways) to a
    network without a token, unless told to."""
    if token or no_auth or is_loopback(host):
        return
    raise ValueError(
        f"refusing to listen on {host} without a token: code execution would be open to the "
        "network. Pass --token or --token-file (KG_TOKEN, KG_TOKEN_FILE), or --no-auth if "
        "you really mean it."
    )


def read_token_file(path: Path) -> str:
    """The token kept in a file (a Docker or Kubernetes secret): its first line, stripped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path}: {exc}") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def resolve_token(values: dict[str, Any]) -> None:
    """`token_file` read into `token` (both given is a mistake: which one is meant?)."""
    if values.get("token_file") is None:
        return
    if values.get("token"):
        raise ValueError(
            "--token (KG_TOKEN) and --token-file (KG_TOKEN_FILE) are both set; give one"
        )
    values["token"] = read_token_file(values["token_file"])
