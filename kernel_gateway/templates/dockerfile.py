"""A Dockerfile read as a template: a base and E2B's build steps (see steps.py).

Our API takes a Dockerfile where E2B's takes a step list; `parse_dockerfile` turns one
into the other with the rules of E2B's own client-side parser (the SDK's
`Template().from_dockerfile`), so a Dockerfile makes the same template through either
door. Its instructions become:

    FROM image [AS name]      the base (`--platform` is ignored); then `USER root` and
                              `WORKDIR /`, Docker's defaults, as E2B's parser starts
    RUN cmd / RUN ["a", "b"]  RUN [cmd]; the exec form shell-joined (`a b`, quoted as
                              needed); `RUN <<EOF` heredocs as E2B rebuilds them
    COPY / ADD src... dest    one COPY [src, dest, user, mode] per source, `--chown=u:g`
                              the user and `--chmod=755` the mode (`0755`), "" when
                              absent; no filesHash (the API attaches the upload's)
    ENV k=v k2="v 2" / ENV k v  ENV [k, v, k2, v2]
    ARG name[=default]        ENV [name, default] (E2B's parser does the same: the value
                              is there for the RUN steps' shell); no step without a value
    WORKDIR path / USER name  WORKDIR [path] / USER [name]
    CMD / ENTRYPOINT          the start command, combined by Docker's rules and
                              shell-joined as E2B joins it
    EXPOSE, VOLUME, LABEL, MAINTAINER, HEALTHCHECK, STOPSIGNAL, ONBUILD, SHELL (a POSIX
    one)                      accepted without effect, listed in `ignored` (so are RUN's
                              `--mount`, `--network`... and COPY's `--link`... flags)

and, as E2B's parser ends, `USER user` unless the Dockerfile has a USER and
`WORKDIR /home/user` unless it has a WORKDIR.

The text is read as Docker reads it: comments, `\\` line continuations (comment lines
inside them skipped), the JSON (exec) and shell forms, quotes and backslash escapes in
COPY, ENV, ARG, WORKDIR and USER. `$name`, `${name}`, `${name:-default}` (and `-`, `+`,
`:+`, `?`, `:?`) are replaced in those by the ARG and ENV values set before; a variable
the Dockerfile does not set (`$PATH`) is kept as written, as E2B's parser keeps every one.
RUN, CMD and ENTRYPOINT are left to the shell, as Docker leaves them.

Refused, with the line and the instruction (`Dockerfile line 3: ADD from a URL is not
supported; download it in a RUN step`): a second FROM or `COPY --from` (multi-stage
builds), no FROM, anything but ARG before FROM, ADD from a URL or a git repository, ADD
of a tar archive (Docker would extract it; `--unpack=false` copies it as is), a COPY
source outside the build context (`../x`, `/etc/x`), COPY from a heredoc, a non-octal
`--chmod`, a SHELL that is not a POSIX shell, `# escape=`, unknown instructions and
flags, and whatever `parse_steps` would refuse in the steps made. At most
`MAX_DOCKERFILE_BYTES` of text, and `MAX_STEPS` steps.

Where E2B's parser differs, this follows Docker: it replaces the variables the Dockerfile
sets (E2B's leaves `FROM python:${PY}` as it is); an ARG before FROM is only FROM's (E2B's
sets it for every step), one without a value sets nothing (E2B's sets it to ""), and one
named like an earlier ENV has no effect (ENV wins). E2B's parser also gives a start
command a ready command, `sleep 20`; that is the API's choice here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kernel_gateway.errors import InvalidRequest
from kernel_gateway.templates.dockerfile_reader import (
    SHOWN_CHARS,
    Heredoc,
    Instruction,
    Lexer,
    Refused,
    heredoc_marker,
    json_array,
    raw_words,
    read_instructions,
    refusal,
    shell_join,
)
from kernel_gateway.templates.steps import MAX_STEPS, parse_step

MAX_DOCKERFILE_BYTES = 1024 * 1024

FlagType = Literal["string", "bool"]
FlagSpecs = Mapping[str, tuple[FlagType, bool]]
"""A flag's name -> (its type, whether it is accepted without effect), as E2B's."""

RUN_FLAGS: FlagSpecs = {
    "mount": ("string", True),
    "network": ("string", True),
    "security": ("string", True),
    "device": ("string", True),
}
COPY_FLAGS: FlagSpecs = {
    "chown": ("string", False),
    "chmod": ("string", False),
    "from": ("string", False),
    "link": ("bool", True),
    "exclude": ("string", True),
    "parents": ("bool", True),
}
ADD_FLAGS: FlagSpecs = {
    **COPY_FLAGS,
    "keep-git-dir": ("bool", True),
    "checksum": ("string", True),
    "unpack": ("bool", False),
}
FROM_FLAGS: FlagSpecs = {"platform": ("string", True)}
NO_FLAGS: FlagSpecs = {}

IGNORED = frozenset(
    {"EXPOSE", "VOLUME", "LABEL", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD"}
)
POSIX_SHELLS = frozenset({"sh", "bash", "dash", "ash", "ksh", "zsh"})

CHMOD = re.compile(r"^[0-7]{3,4}$")
REMOTE_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
GIT_SSH = re.compile(r"^[\w.-]+@[\w.-]+:")
TAR_ARCHIVE = re.compile(r"\.(tar|tgz|tbz|tbz2|txz|tzst|tar\.(gz|bz2|xz|zst))$", re.IGNORECASE)


@dataclass(frozen=True)
class Dockerfile:
    base: str
    """The FROM image (or template name), its ARGs replaced."""
    steps: list[dict[str, object]]
    """Raw steps as E2B's SDK sends them (`{"type", "args"}`), COPY without filesHash."""
    start_cmd: str | None
    ignored: list[str]
    """What was accepted without effect (`EXPOSE 80`, `RUN --mount=...`), to log."""


@dataclass(frozen=True)
class Command:
    """A CMD or ENTRYPOINT: its exec-form words, or its shell-form line (one word)."""

    exec_form: bool
    words: list[str]


def parse_dockerfile(text: str) -> Dockerfile:
    """The base, steps and start command a Dockerfile means; `InvalidRequest` if refused."""
    if len(text) > MAX_DOCKERFILE_BYTES or len(text.encode()) > MAX_DOCKERFILE_BYTES:
        raise InvalidRequest(f"a Dockerfile has at most {MAX_DOCKERFILE_BYTES} bytes")
    converter = Converter()
    for instruction in read_instructions(text):
        try:
            converter.take(instruction)
        except Refused as exc:
            raise refusal(instruction.line, instruction.keyword, exc) from None
    return converter.finish()


class Converter:
    """Takes the instructions in order, as E2B's parser calls its template builder."""

    def __init__(self) -> None:
        self.base: str | None = None
        self.steps: list[dict[str, object]] = []
        self.ignored: list[str] = []
        self.vars: dict[str, str] = {}
        """The ARG and ENV values set so far, for `$name` in later instructions."""
        self.env_names: set[str] = set()
        self.unset: set[str] = set()
        """ARGs declared without a value: `$name` is empty, `${name:-x}` is x."""
        self.global_args: dict[str, str] = {}
        """ARGs before FROM: FROM's, and the default of a later `ARG name`."""
        self.user_set = False
        self.workdir_set = False
        self.cmd: Command | None = None
        self.entrypoint: Command | None = None

    def take(self, ins: Instruction) -> None:
        known = ins.keyword in HANDLED or ins.keyword in IGNORED
        if self.base is None and known and ins.keyword not in ("FROM", "ARG"):
            raise Refused(f"{ins.keyword} comes before FROM; only ARG may")
        handler = HANDLED.get(ins.keyword)
        if handler is not None:
            handler(self, ins)
        elif ins.keyword in IGNORED:
            self.ignored.append(ins.shown())
        else:
            raise Refused(f"{ins.keyword} is not a Dockerfile instruction")

    def finish(self) -> Dockerfile:
        if self.base is None:
            raise InvalidRequest("the Dockerfile has no FROM instruction")
        if not self.user_set:
            self.steps.append({"type": "USER", "args": ["user"]})
        if not self.workdir_set:
            self.steps.append({"type": "WORKDIR", "args": ["/home/user"]})
        if len(self.steps) > MAX_STEPS:
            raise InvalidRequest(
                f"the Dockerfile makes {len(self.steps)} steps; a template has at most {MAX_STEPS}"
            )
        return Dockerfile(self.base, self.steps, self.start_cmd(), self.ignored)

    # Helpers.

    def add(self, ins: Instruction, step: dict[str, object]) -> None:
        """Append a step, checked by steps.py's rules (a stand-in hash for COPY's)."""
        if len(self.steps) >= MAX_STEPS:
            raise Refused(
                f"{ins.keyword} makes step {MAX_STEPS + 1}; a template has at most {MAX_STEPS}"
            )
        probe = {**step, "filesHash": "0" * 64} if step["type"] == "COPY" else step
        try:
            parse_step(0, probe)
        except InvalidRequest as exc:
            message = exc.message.removeprefix("step 1: ")
            kind = str(step["type"])
            if message.startswith(kind):  # `COPY source ...` of an ADD: `ADD source ...`
                message = ins.keyword + message[len(kind) :]
            raise Refused(message) from None
        self.steps.append(step)

    def expand(self, word: str) -> str:
        return Lexer(word, self.vars, keep_unset=True, unset=self.unset).word()

    def flags(self, ins: Instruction, specs: FlagSpecs) -> dict[str, str]:
        """The instruction's flags by name; unknown or repeated ones are refused."""
        values: dict[str, str] = {}
        for flag in ins.flags:
            name, has_value, value = flag[2:].partition("=")
            spec = specs.get(name)
            if spec is None:
                raise Refused(f"{ins.keyword} has no flag --{name}")
            if name in values:
                raise Refused(f"{ins.keyword} --{name} is given twice")
            kind, ignored = spec
            if kind == "bool":
                if value not in ("", "true", "false"):
                    raise Refused(f"{ins.keyword} --{name} is true or false, not {value!r}")
                value = value or "true"
            elif not has_value:
                raise Refused(f"{ins.keyword} --{name} needs a value")
            if ignored:
                self.ignored.append(f"{ins.keyword} {flag}"[:SHOWN_CHARS])
            else:
                values[name] = value
        return values

    def words(self, ins: Instruction) -> list[str]:
        """COPY/ADD's sources and destination, exec or shell form, unexpanded."""
        if ins.heredocs:
            raise Refused(
                f"{ins.keyword} from a heredoc is not supported; write the file in a RUN step"
            )
        exec_form = json_array(ins.rest)
        words = exec_form if exec_form is not None else raw_words(ins.rest)
        if len(words) < 2:
            raise Refused(f"{ins.keyword} takes one or more sources and a destination")
        return words

    # Instructions.

    def from_(self, ins: Instruction) -> None:
        if self.base is not None:
            raise Refused("FROM again: multi-stage builds are not supported")
        self.flags(ins, FROM_FLAGS)
        words = ins.rest.split()
        if not (len(words) == 1 or (len(words) == 3 and words[1].lower() == "as")):
            raise Refused("FROM takes an image, and optionally AS and a name")
        base = Lexer(words[0], self.global_args, keep_unset=False).word()
        if not base or any(ch.isspace() for ch in base):
            raise Refused(f"FROM {words[0]} names no image")
        self.base = base
        # Docker's defaults first, as E2B's parser sets them.
        self.steps += [{"type": "USER", "args": ["root"]}, {"type": "WORKDIR", "args": ["/"]}]

    def arg(self, ins: Instruction) -> None:
        self.flags(ins, NO_FLAGS)
        words = raw_words(ins.rest)
        if not words:
            raise Refused("ARG takes a name, or name=default")
        envs: dict[str, str] = {}
        for word in words:
            raw_name, has_value, raw_value = word.partition("=")
            name = self.expand(raw_name)
            if not name:
                raise Refused("ARG has a blank name")
            if self.base is None:
                if has_value:
                    lexer = Lexer(raw_value, self.global_args, keep_unset=False)
                    self.global_args[name] = lexer.word()
                continue
            value = self.expand(raw_value) if has_value else self.global_args.get(name)
            if name in self.env_names:
                continue  # an ENV's, which wins over an ARG
            if value is None:
                self.unset.add(name)  # declared, no value: no step, as Docker sets none
                continue
            self.unset.discard(name)
            self.vars[name] = envs[name] = value
        if envs:
            self.add(ins, {"type": "ENV", "args": [x for kv in envs.items() for x in kv]})

    def env(self, ins: Instruction) -> None:
        self.flags(ins, NO_FLAGS)
        envs: dict[str, str] = {}
        for raw_name, raw_value in env_pairs(ins.rest):
            name = self.expand(raw_name)
            if not name:
                raise Refused("ENV has a blank name")
            envs[name] = self.expand(raw_value)  # each with the values before this ENV
        self.vars.update(envs)
        self.env_names.update(envs)
        self.unset.difference_update(envs)
        self.add(ins, {"type": "ENV", "args": [x for kv in envs.items() for x in kv]})

    def run(self, ins: Instruction) -> None:
        self.flags(ins, RUN_FLAGS)
        exec_form = json_array(ins.rest)
        if exec_form is not None:
            command = shell_join(exec_form)
        elif ins.heredocs:
            command = heredoc_command(ins.rest, ins.heredocs)
        else:
            command = ins.rest
        if not command.strip():
            raise Refused("RUN needs a command")
        self.add(ins, {"type": "RUN", "args": [command]})

    def copy(self, ins: Instruction) -> None:
        flags = self.flags(ins, ADD_FLAGS if ins.keyword == "ADD" else COPY_FLAGS)
        if "from" in flags:
            raise Refused(
                f"{ins.keyword} --from is not supported: multi-stage builds are not; "
                "copy from the build context"
            )
        words = self.words(ins)
        user = self.expand(flags["chown"]) if "chown" in flags else ""
        mode = ""
        if "chmod" in flags:
            chmod = self.expand(flags["chmod"])
            if not CHMOD.match(chmod):
                raise Refused(f"{ins.keyword} --chmod={chmod} is not an octal mode like 755")
            mode = f"{int(chmod, 8):04o}"
        dest = self.expand(words[-1])
        for raw_src in words[:-1]:
            src = self.expand(raw_src)
            if ins.keyword == "ADD":
                check_add_source(src, unpack=flags.get("unpack", "true") == "true")
            self.add(ins, {"type": "COPY", "args": [src, dest, user, mode]})

    def workdir(self, ins: Instruction) -> None:
        self.add(ins, {"type": "WORKDIR", "args": [self.single(ins)]})
        self.workdir_set = True

    def user(self, ins: Instruction) -> None:
        self.add(ins, {"type": "USER", "args": [self.single(ins)]})
        self.user_set = True

    def single(self, ins: Instruction) -> str:
        self.flags(ins, NO_FLAGS)
        if not ins.rest:
            raise Refused(f"{ins.keyword} takes one argument")
        return self.expand(ins.rest)

    def cmd_(self, ins: Instruction) -> None:
        self.flags(ins, NO_FLAGS)
        self.cmd = command(ins.rest)

    def entrypoint_(self, ins: Instruction) -> None:
        self.flags(ins, NO_FLAGS)
        self.entrypoint = command(ins.rest)

    def shell(self, ins: Instruction) -> None:
        self.flags(ins, NO_FLAGS)
        words = json_array(ins.rest)
        if not words:
            raise Refused('SHELL takes a JSON array, like ["/bin/bash", "-c"]')
        if words[0].rsplit("/", 1)[-1] not in POSIX_SHELLS:
            raise Refused(f"SHELL {words[0]} is not supported: RUN steps run in /bin/bash")
        self.ignored.append(ins.shown())

    def start_cmd(self) -> str | None:
        """CMD and ENTRYPOINT combined by Docker's rules, as E2B's parser combines them:
        an exec-form ENTRYPOINT takes CMD as its arguments (a shell-form CMD as
        `/bin/sh -c cmd`), a shell-form one ignores CMD, and CMD alone is the command."""
        cmd, entrypoint = self.cmd, self.entrypoint
        words: list[str] = []
        if entrypoint is not None and not entrypoint.exec_form:
            joined = " ".join(entrypoint.words)
        elif entrypoint is not None:
            words = list(entrypoint.words)
            if cmd is not None and cmd.exec_form:
                words += cmd.words
            elif cmd is not None and cmd.words:
                words += ["/bin/sh", "-c", cmd.words[0]]
            joined = shell_join(words)
        elif cmd is not None:
            joined = shell_join(cmd.words) if cmd.exec_form else " ".join(cmd.words)
        else:
            return None
        return joined if joined.strip() else None


HANDLED = {
    "FROM": Converter.from_,
    "ARG": Converter.arg,
    "ENV": Converter.env,
    "RUN": Converter.run,
    "COPY": Converter.copy,
    "ADD": Converter.copy,
    "WORKDIR": Converter.workdir,
    "USER": Converter.user,
    "CMD": Converter.cmd_,
    "ENTRYPOINT": Converter.entrypoint_,
    "SHELL": Converter.shell,
}


def env_pairs(rest: str) -> list[tuple[str, str]]:
    """`k=v k2="v 2"` -> [(k, v), (k2, "v 2")] unexpanded; the legacy `k v w` -> [(k, "v w")]."""
    words = raw_words(rest)
    if not words:
        raise Refused("ENV takes name=value pairs")
    if "=" not in words[0]:
        space = re.search(r"\s+", rest)
        if space is None:
            raise Refused(f"ENV {rest} has no value; write ENV {rest}=value")
        return [(rest[: space.start()], rest[space.end() :])]
    pairs: list[tuple[str, str]] = []
    for word in words:
        name, has_value, value = word.partition("=")
        if not has_value:
            raise Refused(f"ENV {word}: no '='; write ENV name=value")
        pairs.append((name, value))
    return pairs


def command(rest: str) -> Command:
    exec_form = json_array(rest)
    if exec_form is not None:
        return Command(True, exec_form)
    return Command(False, [rest] if rest else [])


def check_add_source(src: str, unpack: bool) -> None:
    """ADD is COPY but for remote sources and archives, which are refused."""
    if REMOTE_URL.match(src):
        raise Refused("ADD from a URL is not supported; download it in a RUN step")
    if GIT_SSH.match(src):
        raise Refused("ADD from a git repository is not supported; clone it in a RUN step")
    if unpack and TAR_ARCHIVE.search(src):
        raise Refused(
            f"ADD {src} would extract the archive, which is not supported; COPY it and "
            "extract it in a RUN step (or ADD --unpack=false to copy it as is)"
        )


def heredoc_command(line: str, heredocs: tuple[Heredoc, ...]) -> str:
    """RUN with heredocs, as E2B's parser makes it: `RUN <<EOF` alone runs the body (a
    `#!` one as a script file); otherwise the heredocs go back for the shell to read."""
    if len(heredocs) == 1 and heredoc_marker(line.strip()) is not None:
        heredoc = heredocs[0]
        content = heredoc.content()
        if not content.startswith("#!"):
            return content
        script = shlex.quote(f"/tmp/{heredoc.name}")
        terminator = "E2B_HEREDOC_" + re.sub(r"[^A-Za-z0-9_]", "_", heredoc.name)
        while terminator in content:
            terminator += "_"
        if not content.endswith("\n"):
            content += "\n"
        return (
            f"cat <<'{terminator}' >{script}\n{content}{terminator}\n"
            f"chmod +x {script} && {script}\n"
            f"E2B_EXIT=$?; rm -f {script}; exit $E2B_EXIT"
        )
    return line + "".join(f"\n{heredoc.body}{heredoc.name}" for heredoc in heredocs)
