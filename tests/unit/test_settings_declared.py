"""A setting is declared once: its flag, its variable, its checks and its row of the docs are
made from the declaration, and nothing else names a flag or reads a `KG_*` variable.

- the settings tables of docs/*.md are what `kernel_gateway.cli.settings_doc` makes;
- `serve --help` lists exactly the flags of the configuration page (and `mcp`, `route` those
  of their settings);
- every `--flag` the docs and the README name exists on a parser of ours (or of a well-known
  tool, listed below);
- no module outside the settings modules reads a `KG_*` variable.
"""

from __future__ import annotations

import argparse
import ast
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest

from kernel_gateway.cli.main import build_parser
from kernel_gateway.cli.settings_doc import REGENERATE, TABLES, render, tables
from kernel_gateway.cluster.settings import RouterSettings
from kernel_gateway.cluster.settings import from_args as router_from_args
from kernel_gateway.settings import Settings, from_args, from_env, markdown_table
from kernel_gateway.settings.client import ClientSettings, McpSettings, client_settings
from kernel_gateway.settings.declare import declared, flag

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
CONFIGURATION = DOCS / "configuration.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
TABLE_FLAG = re.compile(r"^\| `(--[a-z0-9-]+)`", re.MULTILINE)

# Flags of other programs that the docs show in their commands. Keep it short: a flag of ours
# that the docs misspell must not hide here.
EXTERNAL_FLAGS = {
    "--gateway-url",  # jupyter lab / jupyter server (docs/jupyter.md)
    "--strict",  # mypy --strict, mkdocs build --strict
    "--test",  # node --test (the E2B JavaScript SDK's tests)
    "--test-force-exit",  # node --test --test-force-exit
    "--user",  # pip install --user
    "--quiet",  # pip install --quiet
    "--upgrade",  # pip-compile --upgrade (make lock ARGS=--upgrade)
    "--require-hashes",  # pip install --require-hashes
    "--no-index",  # pip install --no-index
    "--find-links",  # pip install --find-links
    "--index-url",  # pip install --index-url (docs/templates.md)
    "--extra-index-url",  # pip install --extra-index-url
    "--trusted-host",  # pip install --trusted-host
    "--from",  # Dockerfile COPY --from (docs/templates.md)
    "--no-cache-dir",  # pip install --no-cache-dir
    "--generate-hashes",  # pip-compile --generate-hashes
    "--no-install-recommends",  # apt-get install
    "--variant",  # debootstrap --variant=minbase
    "--sparse",  # cp --sparse
    "--host-uds",  # runsc (gVisor) --host-uds=all
    "--data-binary",  # curl --data-binary
    "--config-file",  # st (Schemathesis) --config-file
    "--checks",  # st run --checks
    "--max-examples",  # st run --max-examples
}


def parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """`parser` and every subcommand's parser under it, by their prog."""
    found = {parser.prog: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.update(parsers(sub))
    return found


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def command(name: str) -> argparse.ArgumentParser:
    return parsers(build_parser())[f"kernel-gateway {name}"]


def bench_flags() -> set[str]:
    """The flags of bench/*.py, whose parsers are made inside their main()."""
    found: set[str] = set()
    for script in (ROOT / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                found |= {
                    arg.value
                    for arg in node.args
                    if isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.startswith("--")
                }
    return found


# -- (1) the tables of the docs are generated ---------------------------------------------


def test_the_configuration_page_holds_the_generated_tables() -> None:
    held = tables(CONFIGURATION.read_text(encoding="utf-8"))
    assert {"serve", "client"} <= set(held), f"{CONFIGURATION} lost its settings markers"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_settings_tables_are_up_to_date(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert render(text) == text, (
        f"the settings tables of {page.relative_to(ROOT)} are stale (a declaration in "
        f"kernel_gateway/settings/ changed): run {REGENERATE}"
    )


def test_every_settings_class_makes_a_table() -> None:
    for settings_class in TABLES.values():
        rows = TABLE_FLAG.findall(markdown_table(settings_class))
        assert rows == [flag(f.name) for f in fields(settings_class)]


# -- (2) the flags are the declarations ----------------------------------------------------


def test_serve_help_lists_exactly_the_flags_of_the_page() -> None:
    page = tables(CONFIGURATION.read_text(encoding="utf-8"))["serve"]
    on_page = TABLE_FLAG.findall(page)
    assert len(on_page) == len(set(on_page))
    assert long_flags(command("serve")) - {"--help"} == set(on_page)
    assert set(on_page) == {flag(f.name) for f in fields(Settings)}


@pytest.mark.parametrize(
    ("name", "settings_class"), [("route", RouterSettings), ("mcp", McpSettings)]
)
def test_route_and_mcp_flags_are_their_settings(name: str, settings_class: type) -> None:
    assert long_flags(command(name)) - {"--help"} == {flag(f.name) for f in fields(settings_class)}


def test_run_has_the_client_settings_flags() -> None:
    assert {flag(f.name) for f in fields(ClientSettings)} <= long_flags(command("run"))


def test_serve_help_names_the_variable_and_the_default() -> None:
    text = command("serve").format_help()
    assert "KG_INTERRUPT_GRACE; default: 1.5" in " ".join(text.split())


@pytest.mark.parametrize("settings_class", [Settings, RouterSettings, McpSettings])
def test_every_field_is_declared(settings_class: type) -> None:
    names = [f.name for f, _ in declared(settings_class)]  # raises on an undeclared field
    assert names == [f.name for f in fields(settings_class)]


def test_a_new_flag_wins_over_its_variable() -> None:
    args = command("serve").parse_args(["--interrupt-grace", "2.5", "--max-file-events", "7"])
    s = from_args(args, {"KG_INTERRUPT_GRACE": "9", "KG_MAX_FILE_EVENTS": "3", "KG_PORT": "1"})
    assert (s.interrupt_grace, s.max_file_events, s.port) == (2.5, 7, 1)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--interrupt-grace", "nan"], "--interrupt-grace (KG_INTERRUPT_GRACE)"),
        (["--max-body-bytes", "0"], "--max-body-bytes (KG_MAX_BODY_BYTES)"),
        (["--log-level", "error", "--figure-dpi", "5"], "--figure-dpi (KG_FIGURE_DPI)"),
        (["--max-exec-timeout", "10"], "--exec-timeout (KG_EXEC_TIMEOUT)"),
    ],
)
def test_a_bad_flag_value_is_refused_naming_the_flag(argv: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        from_args(command("serve").parse_args(argv), {})


def test_a_value_argparse_cannot_read_exits_with_status_2() -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--kernel-start-timeout", "soon"])
    assert exited.value.code == 2


def test_log_levels_are_checked_like_any_choice() -> None:
    with pytest.raises(ValueError, match=re.escape("--log-level (KG_LOG_LEVEL)")):
        from_env({"KG_LOG_LEVEL": "loud"})


def test_router_flags_win_over_variables() -> None:
    args = command("route").parse_args(["--nodes", "a:1", "--poll-interval", "2"])
    s = router_from_args(args, {"KG_NODES": "b", "KG_POLL_INTERVAL": "5", "KG_NODE_WAIT": "4"})
    assert (s.nodes, s.poll_interval, s.node_wait) == ("a:1", 2, 4)
    with pytest.raises(ValueError, match=re.escape("--nodes (KG_NODES)")):
        RouterSettings(nodes="a:0")
    with pytest.raises(ValueError, match=re.escape("--connect-timeout (KG_CONNECT_TIMEOUT)")):
        RouterSettings(nodes="a", connect_timeout=math.inf)


def test_client_commands_read_their_variables_through_their_settings() -> None:
    args = command("mcp").parse_args(["--token", "flag"])
    env = {"KG_URL": "http://gw:1", "KG_TOKEN": "env", "KG_LOG_LEVEL": "debug"}
    s = client_settings(McpSettings, args, env)
    assert (s.url, s.token, s.log_level) == ("http://gw:1", "flag", "debug")
    run = client_settings(ClientSettings, command("run").parse_args(["print(1)"]), {"KG_URL": ""})
    assert (run.url, run.token) == (None, None)


# -- (3) the docs name only flags that exist ---------------------------------------------


def test_every_flag_the_docs_name_exists() -> None:
    ours = set().union(*(long_flags(p) for p in parsers(build_parser()).values()))
    known = ours | bench_flags() | EXTERNAL_FLAGS
    unknown: dict[str, list[str]] = {}
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for name in FLAG.findall(line):
                if name not in known:
                    unknown.setdefault(name, []).append(f"{page.relative_to(ROOT)}:{number}")
    assert not unknown, (
        "the docs name flags that no kernel-gateway command (nor bench/, nor a tool in "
        f"EXTERNAL_FLAGS) has: {unknown}"
    )


def test_the_external_allowlist_names_no_flag_of_ours() -> None:
    ours = set().union(*(long_flags(p) for p in parsers(build_parser()).values()))
    assert not EXTERNAL_FLAGS & (ours | bench_flags())


# -- (4) only the settings modules read KG_* variables -------------------------------------

SETTINGS_MODULES = ("kernel_gateway/settings/", "kernel_gateway/cluster/settings.py")
# Variables that are not settings, and the folder that may read them: the fork server's
# marker to its own re-executed self (it runs in the kernel's container).
NOT_SETTINGS = {"KG_FORK_SERVER_ALLOCATOR": "kernel_gateway/in_kernel/"}
READS = {"get", "pop", "setdefault", "getenv", "__getitem__", "__contains__"}


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, `environ`, an `env`/`environ` parameter, `os` (for `os.getenv`)."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in ("environ", "env", "os") or name.endswith("environ")


def kg_reads(source: str) -> list[tuple[int, str]]:
    """`(line, variable)` of each read of a `KG_*` variable: `environ.get("KG_X")`,
    `environ["KG_X"]`, `os.getenv(NAME)` (a module constant), `"KG_X" in environ`."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id, "")
        return ""

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        key = ""
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in READS
            and _is_environ(node.func.value)
            and node.args
        ):
            key = text(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = text(node.slice)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _is_environ(node.comparators[0])
        ):
            key = text(node.left)
        if key.startswith("KG_"):
            found.append((getattr(node, "lineno", 0), key))
    return found


def test_the_read_finder_finds_reads() -> None:
    source = (
        "import os\nNAME = 'KG_B'\nos.environ.get('KG_A')\nos.getenv(NAME)\n"
        "environ['KG_C']\n'KG_D' in os.environ\nos.environ.get('HOME')\n"
    )
    assert [key for _, key in kg_reads(source)] == ["KG_A", "KG_B", "KG_C", "KG_D"]


def test_only_the_settings_modules_read_kg_variables() -> None:
    package = ROOT / "kernel_gateway"
    stray = []
    for module in sorted(package.rglob("*.py")):
        path = module.relative_to(ROOT).as_posix()
        if path.startswith(SETTINGS_MODULES) or "__pycache__" in path:
            continue
        for line, key in kg_reads(module.read_text(encoding="utf-8")):
            if not path.startswith(NOT_SETTINGS.get(key, "\0")):
                stray.append(f"{path}:{line} reads {key}")
    assert not stray, (
        "KG_* variables are settings: declare them in kernel_gateway/settings/ (or a "
        "cluster/settings.py field) and read them there: " + "; ".join(stray)
    )
