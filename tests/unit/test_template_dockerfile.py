"""The Dockerfile parser (kernel_gateway/templates/dockerfile.py), without Docker.

Real-world Dockerfiles with their exact steps; the same Dockerfiles through E2B's own
parser (the SDK's `Template().from_dockerfile`) where no variable is involved, since
that is the behaviour to match; the variable rules; and every refusal, with its line.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernel_gateway.errors import InvalidRequest
from kernel_gateway.templates.dockerfile import (
    MAX_DOCKERFILE_BYTES,
    Dockerfile,
    parse_dockerfile,
)
from kernel_gateway.templates.steps import MAX_STEPS, parse_steps

START = [{"type": "USER", "args": ["root"]}, {"type": "WORKDIR", "args": ["/"]}]
"""Docker's defaults, which every parsed Dockerfile's steps start with (as E2B's)."""
END = [{"type": "USER", "args": ["user"]}, {"type": "WORKDIR", "args": ["/home/user"]}]
"""E2B's defaults, after the steps of a Dockerfile with no USER and no WORKDIR."""


def run(command: str) -> dict[str, object]:
    return {"type": "RUN", "args": [command]}


def copy(src: str, dest: str, user: str = "", mode: str = "") -> dict[str, object]:
    return {"type": "COPY", "args": [src, dest, user, mode]}


def env(*args: str) -> dict[str, object]:
    return {"type": "ENV", "args": list(args)}


def middle(text: str) -> list[dict[str, object]]:
    """The steps of a Dockerfile with no USER or WORKDIR, between the defaults."""
    steps = parse_dockerfile(text).steps
    assert steps[:2] == START and steps[-2:] == END, steps
    return steps[2:-2]


def refusal(text: str) -> str:
    with pytest.raises(InvalidRequest) as caught:
        parse_dockerfile(text)
    return caught.value.message


# Real-world Dockerfiles.

PYTHON_APP = """\
# syntax=docker/dockerfile:1
ARG PYTHON_VERSION=3.12
FROM python:${PYTHON_VERSION}-slim AS runtime

ARG APP_USER=app
ENV PYTHONDONTWRITEBYTECODE=1 \\
    PYTHONUNBUFFERED=1 \\
    APP_HOME=/srv/app

WORKDIR $APP_HOME

# System packages first: they change least.
RUN apt-get update \\
    && apt-get install -y --no-install-recommends \\
        build-essential \\
        # for psycopg
        libpq-dev \\
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home ${APP_USER}
COPY --chown=${APP_USER}:${APP_USER} requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt
COPY --chown=${APP_USER}:${APP_USER} src/ ./src/
USER ${APP_USER}
EXPOSE 8000
HEALTHCHECK --interval=30s CMD curl -f http://localhost:8000/health || exit 1
CMD ["gunicorn", "--bind", "0.0.0.0:8000", "app.wsgi:application"]
"""


def test_a_python_app_dockerfile() -> None:
    parsed = parse_dockerfile(PYTHON_APP)
    assert parsed.base == "python:3.12-slim"
    assert parsed.steps == [
        *START,
        env("APP_USER", "app"),
        env("PYTHONDONTWRITEBYTECODE", "1", "PYTHONUNBUFFERED", "1", "APP_HOME", "/srv/app"),
        {"type": "WORKDIR", "args": ["/srv/app"]},
        # Continuations joined as Docker joins them: the `\` goes, the indentation stays,
        # the comment line inside is skipped.
        run(
            "apt-get update     && apt-get install -y --no-install-recommends"
            "         build-essential         libpq-dev     && rm -rf /var/lib/apt/lists/*"
        ),
        run("useradd --create-home ${APP_USER}"),  # RUN is the shell's to expand
        copy("requirements.txt", "./", "app:app"),
        run("pip install --no-cache-dir -r requirements.txt"),
        copy("src/", "./src/", "app:app"),
        {"type": "USER", "args": ["app"]},
        # The Dockerfile has a USER and a WORKDIR: no E2B defaults after them.
    ]
    assert parsed.start_cmd == "gunicorn --bind 0.0.0.0:8000 app.wsgi:application"
    assert parsed.ignored == [
        "EXPOSE 8000",
        "HEALTHCHECK --interval=30s CMD curl -f http://localhost:8000/health || exit 1",
    ]


NODE_APP = """\
FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /usr/src/app
COPY package.json package-lock.json ./
RUN --mount=type=cache,target=/root/.npm npm ci --omit=dev
COPY --chmod=755 docker-entrypoint.sh /usr/local/bin/
COPY . .
VOLUME ["/data"]
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["node", "server.js"]
"""


def test_a_node_app_dockerfile() -> None:
    parsed = parse_dockerfile(NODE_APP)
    assert parsed.base == "node:20-bookworm-slim"
    assert parsed.steps == [
        *START,
        env("NODE_ENV", "production"),
        {"type": "WORKDIR", "args": ["/usr/src/app"]},
        copy("package.json", "./"),  # one COPY step per source, as E2B's SDK makes them
        copy("package-lock.json", "./"),
        run("npm ci --omit=dev"),
        copy("docker-entrypoint.sh", "/usr/local/bin/", mode="0755"),
        copy(".", "."),
        {"type": "USER", "args": ["user"]},  # no USER in the Dockerfile: E2B's default
    ]
    assert parsed.start_cmd == "docker-entrypoint.sh node server.js"
    assert parsed.ignored == ["RUN --mount=type=cache,target=/root/.npm", 'VOLUME ["/data"]']


DATA_IMAGE = """\
FROM ubuntu:22.04
LABEL maintainer="Data Team <data@example.com>" \\
      org.opencontainers.image.source="https://example.com/repo"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND noninteractive
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv
RUN apt-get update && apt-get install -y python3-venv curl && \\
    python3 -m venv $VIRTUAL_ENV
COPY ["requirements lock.txt", "/tmp/"]
RUN ["pip", "install", "-r", "/tmp/requirements lock.txt"]
ADD --chown=1000:1000 notebooks/ /home/user/notebooks/
ENTRYPOINT jupyter lab --ip=0.0.0.0
STOPSIGNAL SIGINT
"""


def test_a_data_image_dockerfile() -> None:
    parsed = parse_dockerfile(DATA_IMAGE)
    assert parsed.base == "ubuntu:22.04"
    assert parsed.steps == [
        *START,
        env("DEBIAN_FRONTEND", "noninteractive"),  # the legacy `ENV name value`
        env("PATH", "/opt/venv/bin:$PATH", "VIRTUAL_ENV", "/opt/venv"),  # $PATH: the base's
        run(
            "apt-get update && apt-get install -y python3-venv curl &&"
            "     python3 -m venv $VIRTUAL_ENV"
        ),
        copy("requirements lock.txt", "/tmp/"),
        run("pip install -r '/tmp/requirements lock.txt'"),  # exec form, shell-joined
        copy("notebooks/", "/home/user/notebooks/", "1000:1000"),  # ADD of local files
        *END,
    ]
    assert parsed.start_cmd == "jupyter lab --ip=0.0.0.0"
    assert parsed.ignored == [
        'LABEL maintainer="Data Team <data@example.com>"       '
        'org.opencontainers.image.source="https://example.com/repo"',
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]',
        "STOPSIGNAL SIGINT",
    ]


def test_a_multi_stage_dockerfile_is_refused_at_its_second_from() -> None:
    go_app = """\
FROM golang:1.22 AS build
WORKDIR /src
COPY . .
RUN go build -o /out/app ./cmd/app

FROM gcr.io/distroless/base-debian12
COPY --from=build /out/app /app
"""
    assert refusal(go_app) == (
        "Dockerfile line 6: FROM again: multi-stage builds are not supported"
    )


def test_the_steps_made_are_steps_the_api_takes() -> None:
    """With the upload's hash attached to each COPY, `parse_steps` takes them all."""
    for text in (PYTHON_APP, NODE_APP, DATA_IMAGE):
        steps = parse_dockerfile(text).steps
        with_hashes = [{**s, "filesHash": "a" * 64} if s["type"] == "COPY" else s for s in steps]
        assert [s.to_json() for s in parse_steps(with_hashes)] == with_hashes


# The same as E2B's own parser.

SAME_AS_E2B = {
    "node app": NODE_APP,
    "continuations and comments": """\
FROM debian:bookworm
# a comment

RUN set -eux; \\
    # inside a continuation
    apt-get update; \\

    apt-get install -y git
RUN echo a\\\\
""",
    "env forms and quoting": """\
FROM alpine:3.20
ENV A=1 B="two words" C='single $quoted' D=esc\\ aped
ENV LEGACY a value with spaces
ENV QUOTED "in quotes"
WORKDIR "/my dir"
USER 1000:1000
""",
    "exec and shell forms": """\
from python:3.11
run ["python", "-c", "print('hi there')"]
Run echo "it's" | tee /tmp/x
ENTRYPOINT ["python", "-m"]
CMD ["http.server", "8080"]
""",
    "entrypoint exec with shell cmd": """\
FROM node:20
ENTRYPOINT ["node"]
CMD server.js --port 3000
""",
    "shell entrypoint ignores cmd": """\
FROM ubuntu
CMD ["ignored"]
ENTRYPOINT /usr/local/bin/start.sh --verbose
""",
    "copy flags and sources": """\
FROM python:3.12
COPY --chown=app:app --chmod=640 a.txt "b c.txt" dir/ /dest/
COPY --link --chmod=0755 run.sh /usr/local/bin/run.sh
ADD ./local.tar.gz.txt /opt/
COPY ["x y.txt", "/z/"]
""",
    "heredocs": """\
FROM alpine
RUN <<EOF
apk add --no-cache curl
echo done
EOF
RUN cat <<EOF > /etc/motd
Welcome, $USER
EOF
RUN <<-EOF
\tset -e
\techo tabs
\tEOF
RUN <<EOF
#!/usr/bin/env python3
print("hi")
EOF
""",
    "arg with a literal value": """\
FROM rust:1.80
ARG PROFILE=release
RUN cargo build --profile "$PROFILE"
CMD ["/app"]
""",
}


@pytest.mark.parametrize("text", SAME_AS_E2B.values(), ids=SAME_AS_E2B.keys())
def test_steps_are_e2bs(text: str) -> None:
    e2b = pytest.importorskip("e2b")
    builder = e2b.Template().from_dockerfile(text)
    template = builder._template
    theirs = [
        {"type": str(i["type"].value), "args": list(i["args"])} for i in template._instructions
    ]
    ours = parse_dockerfile(text)
    assert ours.steps == theirs
    assert ours.base == template._base_image
    assert ours.start_cmd == template._start_cmd


def test_heredocs_become_commands_as_e2b_makes_them() -> None:
    steps = middle(SAME_AS_E2B["heredocs"])
    assert steps[0] == run("apk add --no-cache curl\necho done\n")
    assert steps[1] == run("cat <<EOF > /etc/motd\nWelcome, $USER\nEOF")
    assert steps[2] == run("set -e\necho tabs\n")  # `<<-`: the tabs go
    script = steps[3]["args"]
    assert isinstance(script, list)
    assert script[0] == (  # a `#!` body runs as a script file
        "cat <<'E2B_HEREDOC_EOF' >/tmp/EOF\n"
        '#!/usr/bin/env python3\nprint("hi")\n'
        "E2B_HEREDOC_EOF\n"
        "chmod +x /tmp/EOF && /tmp/EOF\n"
        "E2B_EXIT=$?; rm -f /tmp/EOF; exit $E2B_EXIT"
    )


# Variables.


def test_args_before_from_are_froms_only() -> None:
    parsed = parse_dockerfile(
        "ARG BASE=python\nARG TAG\nFROM ${BASE}:${TAG:-3.12}-slim\nRUN echo $BASE\n"
    )
    assert parsed.base == "python:3.12-slim"
    assert parsed.steps == [*START, run("echo $BASE"), *END]  # no ENV: Docker scopes it


def test_an_arg_redeclared_after_from_takes_the_value_before() -> None:
    steps = middle("ARG V=1.2\nFROM img:$V\nARG V\nENV FULL=v$V\n")
    assert steps == [env("V", "1.2"), env("FULL", "v1.2")]


def test_references_are_replaced_in_every_form() -> None:
    steps = middle(
        "FROM a\n"
        "ARG DIR=/opt/app NAME=tool\n"
        "ENV BIN=$DIR/bin CONF=${DIR}/etc QUOTED=\"${NAME}-x\" SINGLE='$NAME' ESCAPED=\\$NAME\n"
        "COPY --chown=${NAME} $NAME.cfg ${DIR}/\n"
    )
    assert steps == [
        env("DIR", "/opt/app", "NAME", "tool"),
        env(
            "BIN",
            "/opt/app/bin",
            "CONF",
            "/opt/app/etc",
            "QUOTED",
            "tool-x",
            "SINGLE",
            "$NAME",
            "ESCAPED",
            "$NAME",
        ),
        copy("tool.cfg", "/opt/app/", "tool"),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${SET:-d}", "yes"),
        ("${EMPTY:-d}", "d"),
        ("${EMPTY-d}", ""),
        ("${DECLARED:-d}", "d"),  # an ARG without a value is unset
        ("${DECLARED}", ""),
        ("${SET:+alt}", "alt"),
        ("${EMPTY:+alt}", ""),
        ("${SET:?needed}", "yes"),
        ("${UNKNOWN:-d}", "${UNKNOWN:-d}"),  # the base image may set it: kept as written
        ("$UNKNOWN/x", "$UNKNOWN/x"),
        ("${SET:-${UNKNOWN}}", "yes"),
        ("${EMPTY:-${SET}}", "yes"),
        ("a$", "a$"),
        ("$1", "$1"),
    ],
)
def test_substitution_modifiers(value: str, expected: str) -> None:
    text = f"FROM a\nARG SET=yes EMPTY= DECLARED\nENV OUT={value}\n"
    assert middle(text)[-1] == env("OUT", expected)


def test_env_values_see_the_values_before_their_env() -> None:
    steps = middle("FROM a\nENV A=1\nENV A=2 B=$A\nENV C=$A\n")
    assert steps == [env("A", "1"), env("A", "2", "B", "1"), env("C", "2")]


def test_an_env_wins_over_a_later_arg() -> None:
    steps = middle("FROM a\nENV MODE=prod\nARG MODE=dev\nENV SEEN=$MODE\n")
    assert steps == [env("MODE", "prod"), env("SEEN", "prod")]


def test_run_cmd_and_entrypoint_are_not_expanded() -> None:
    parsed = parse_dockerfile('FROM a\nARG X=1\nRUN echo $X\nCMD ["echo", "$X"]\n')
    assert parsed.steps[-3] == run("echo $X")
    assert parsed.start_cmd == "echo '$X'"


# Reading.


def test_lowercase_crlf_and_a_byte_order_mark() -> None:
    parsed = parse_dockerfile("\ufefffrom alpine\r\nrun echo hi \\\r\n  there\r\ncmd sh\r\n")
    assert parsed.base == "alpine"
    assert parsed.steps == [*START, run("echo hi   there"), *END]
    assert parsed.start_cmd == "sh"


def test_flags_before_the_arguments_only() -> None:
    assert middle("FROM a\nRUN -- --not-a-flag\nRUN echo --chown=x\n") == [
        run("--not-a-flag"),
        run("echo --chown=x"),
    ]


def test_from_platform_is_ignored() -> None:
    parsed = parse_dockerfile("FROM --platform=linux/amd64 python:3.12 AS base\n")
    assert parsed.base == "python:3.12"
    assert parsed.ignored == ["FROM --platform=linux/amd64"]


def test_start_command_rules() -> None:
    def start(text: str) -> str | None:
        return parse_dockerfile("FROM a\n" + text).start_cmd

    assert start("") is None
    assert start("CMD []\n") is None
    assert start('CMD ["a"]\nCMD ["b", "c d"]\n') == "b 'c d'"  # the last one counts
    assert start('ENTRYPOINT ["tini", "--"]\n') == "tini --"
    assert start('CMD ["x"]\nENTRYPOINT ["tini", "--"]\n') == "tini -- x"
    assert start('ENTRYPOINT ["e"]\nCMD run it\n') == "e /bin/sh -c 'run it'"


def test_add_of_an_archive_with_unpack_false_is_a_copy() -> None:
    assert middle("FROM a\nADD --unpack=false data.tar.gz /data/\n") == [
        copy("data.tar.gz", "/data/")
    ]


def test_result_is_a_frozen_dataclass() -> None:
    parsed = parse_dockerfile("FROM a\n")
    assert isinstance(parsed, Dockerfile)
    with pytest.raises(AttributeError):
        parsed.base = "b"  # type: ignore[misc]


# Refusals.

REFUSED = {
    "no from": ("RUN echo\n", "Dockerfile line 1: RUN comes before FROM; only ARG may"),
    "empty": ("# only a comment\n\n", "the Dockerfile has no FROM instruction"),
    "only args": ("ARG X=1\n", "the Dockerfile has no FROM instruction"),
    "add url": (
        "FROM a\nRUN true\nADD https://example.com/tool.tgz /opt/\n",
        "Dockerfile line 3: ADD from a URL is not supported; download it in a RUN step",
    ),
    "add git": (
        "FROM a\nADD git@github.com:org/repo.git /src\n",
        "Dockerfile line 2: ADD from a git repository is not supported; clone it in a RUN step",
    ),
    "add archive": (
        "FROM a\nADD rootfs.tar.xz /\n",
        "Dockerfile line 2: ADD rootfs.tar.xz would extract the archive, which is not "
        "supported; COPY it and extract it in a RUN step (or ADD --unpack=false to copy "
        "it as is)",
    ),
    "copy from": (
        "FROM a\nCOPY --from=builder /out /app\n",
        "Dockerfile line 2: COPY --from is not supported: multi-stage builds are not; "
        "copy from the build context",
    ),
    "copy parent": (
        "FROM a\nCOPY ../secrets /x\n",
        "Dockerfile line 2: COPY source '../secrets' is outside the build context",
    ),
    "copy absolute": (
        "FROM a\nCOPY /etc/passwd /x\n",
        "Dockerfile line 2: COPY source '/etc/passwd' is outside the build context",
    ),
    "add absolute": (
        "FROM a\nADD /etc/passwd /x\n",
        "Dockerfile line 2: ADD source '/etc/passwd' is outside the build context",
    ),
    "copy heredoc": (
        "FROM a\nCOPY <<EOF /etc/x\nhello\nEOF\n",
        "Dockerfile line 2: COPY from a heredoc is not supported; write the file in a RUN step",
    ),
    "copy one word": (
        "FROM a\nCOPY onlyone\n",
        "Dockerfile line 2: COPY takes one or more sources and a destination",
    ),
    "bad chmod": (
        "FROM a\nCOPY --chmod=u+x run.sh /bin/\n",
        "Dockerfile line 2: COPY --chmod=u+x is not an octal mode like 755",
    ),
    "bad chown": (
        "FROM a\nCOPY --chown='a b' x /y\n",
        "Dockerfile line 2: COPY: 'a b' is not a user name",
    ),
    "unknown flag": ("FROM a\nRUN --foo=1 x\n", "Dockerfile line 2: RUN has no flag --foo"),
    "flag twice": (
        "FROM a\nCOPY --chown=a --chown=b x /y\n",
        "Dockerfile line 2: COPY --chown is given twice",
    ),
    "flag on cmd": ("FROM a\nCMD --help\n", "Dockerfile line 2: CMD has no flag --help"),
    "bad bool flag": (
        "FROM a\nCOPY --link=maybe x /y\n",
        "Dockerfile line 2: COPY --link is true or false, not 'maybe'",
    ),
    "unknown instruction": (
        "FROM a\nRUNN echo\n",
        "Dockerfile line 2: RUNN is not a Dockerfile instruction",
    ),
    "env without value": (
        "FROM a\nENV LONELY\n",
        "Dockerfile line 2: ENV LONELY has no value; write ENV LONELY=value",
    ),
    "env mixed forms": (
        "FROM a\nENV A=1 B\n",
        "Dockerfile line 2: ENV B: no '='; write ENV name=value",
    ),
    "env bad name": (
        "FROM a\nENV my-var=1\n",
        "Dockerfile line 2: ENV name 'my-var' is not a valid variable name",
    ),
    "arg bad name": (
        "FROM a\nARG my-arg=1\n",
        "Dockerfile line 2: ARG name 'my-arg' is not a valid variable name",
    ),
    "bad user": ("FROM a\nUSER 'a b'\n", "Dockerfile line 2: USER: 'a b' is not a user name"),
    "empty workdir": ("FROM a\nWORKDIR\n", "Dockerfile line 2: WORKDIR takes one argument"),
    "unterminated quote": (
        'FROM a\nWORKDIR "/x\n',
        "Dockerfile line 2: WORKDIR: a closing \" is missing in '\"/x'",
    ),
    "unterminated heredoc": (
        "FROM a\nRUN <<EOF\necho\n",
        "Dockerfile line 2: RUN: the heredoc <<EOF has no end",
    ),
    "empty run": ("FROM a\nRUN\n", "Dockerfile line 2: RUN needs a command"),
    "empty exec run": ("FROM a\nRUN []\n", "Dockerfile line 2: RUN needs a command"),
    "exec form numbers": (
        'FROM a\nCMD ["sleep", 1]\n',
        "Dockerfile line 2: CMD: a JSON (exec form) array holds only strings",
    ),
    "bad substitution": (
        "FROM a\nENV A=${B%.txt}\n",
        "Dockerfile line 2: ENV: ${B%...} is not a supported substitution",
    ),
    "required variable": (
        "FROM a\nARG B=\nENV A=${B:?B must be set}\n",
        "Dockerfile line 3: ENV must: no '='; write ENV name=value",  # split as Docker does
    ),
    "required variable quoted": (
        'FROM a\nARG B=\nENV A="${B:?must be set}"\n',
        "Dockerfile line 3: ENV: B: must be set",
    ),
    "nesting": (
        "FROM a\nENV A=" + "${A:-" * 50 + "\n",
        "Dockerfile line 2: ENV: substitutions nest over 20 deep",
    ),
    "from without image": (
        "FROM ${NOTHING}\n",
        "Dockerfile line 1: FROM ${NOTHING} names no image",
    ),
    "from extra words": (
        "FROM a b\n",
        "Dockerfile line 1: FROM takes an image, and optionally AS and a name",
    ),
    "powershell": (
        'FROM a\nSHELL ["pwsh", "-Command"]\n',
        "Dockerfile line 2: SHELL pwsh is not supported: RUN steps run in /bin/bash",
    ),
    "escape directive": (
        "# escape=`\nFROM a\n",
        "Dockerfile line 1: the escape directive is not supported",
    ),
    "line after continuations": (
        "FROM a\n\n# note\nRUN a \\\n  b \\\n\n  c\nCOPY x\n",
        "Dockerfile line 8: COPY takes one or more sources and a destination",
    ),
}


@pytest.mark.parametrize(("text", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_refused(text: str, message: str) -> None:
    assert refusal(text) == message


def test_at_most_a_mebibyte() -> None:
    text = "FROM a\nRUN " + "x" * MAX_DOCKERFILE_BYTES + "\n"
    assert refusal(text) == f"a Dockerfile has at most {MAX_DOCKERFILE_BYTES} bytes"
    multibyte = "FROM a\nLABEL x=" + "é" * (MAX_DOCKERFILE_BYTES // 2) + "\n"
    assert len(multibyte) < MAX_DOCKERFILE_BYTES
    assert refusal(multibyte) == f"a Dockerfile has at most {MAX_DOCKERFILE_BYTES} bytes"


def test_at_most_max_steps() -> None:
    # Two defaults first, then each RUN is a step: the one making step 101 is refused.
    assert refusal("FROM a\n" + "RUN x\n" * (MAX_STEPS - 1)) == (
        f"Dockerfile line {MAX_STEPS}: RUN makes step {MAX_STEPS + 1}; "
        f"a template has at most {MAX_STEPS}"
    )
    # The two E2B defaults at the end count too.
    assert refusal("FROM a\n" + "RUN x\n" * (MAX_STEPS - 3)) == (
        f"the Dockerfile makes {MAX_STEPS + 1} steps; a template has at most {MAX_STEPS}"
    )
    full = "FROM a\nUSER u\nWORKDIR /w\n" + "RUN x\n" * (MAX_STEPS - 4)
    assert len(parse_dockerfile(full).steps) == MAX_STEPS


def test_e2b_parser_message_cases_still_refused() -> None:
    """Inputs E2B's parser refuses are refused here too (the wording is ours)."""
    e2b_template: Any = pytest.importorskip("e2b.template.dockerfile_parser")
    for text in ("RUN x\n", "FROM a\nFROM b\n", "FROM a\nCOPY --from=x a b\n", "FROM a\nFOO x\n"):
        with pytest.raises(ValueError):
            e2b_template.parse_dockerfile(text, _NullBuilder())
        refusal(text)


class _NullBuilder:
    """A template builder for E2B's parser that records nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self
