"""A sandbox's code contexts (E2B's `/contexts`): kernels of their own on its files, each
set up with the sandbox's environment variables and its working directory, now and in every
kernel that replaces it (a restart, a revival)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import ENV_LANGUAGES, env_code
from kernel_gateway.protocols.e2b.envd_entries import HOME
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.sessions.session import Session

logger = logging.getLogger(__name__)

SETUP_SECONDS = 30.0
CHDIR = {
    "python": "import os as __kg_os\n__kg_os.chdir({path})\ndel __kg_os",
    "r": "setwd({path})",
    "javascript": "Deno.chdir({path})",
    "typescript": "Deno.chdir({path})",
    "bash": "cd {path}",
}
"""How each language's kernel changes directory (a JSON string is a literal in all of them)."""
LISTED_DEFAULTS = ("python", "javascript")
"""The languages whose default contexts a new sandbox lists, as E2B's code interpreter
starts them. One other than the sandbox's own is listed with its id at once, and its kernel
starts on its first use (a JavaScript kernel a sandbox never uses costs nothing)."""


@dataclass(frozen=True)
class Context:
    """A code context: a kernel of its own in the sandbox (same files, its own variables).
    Its id is its session's, except for a listed default context (`LISTED_DEFAULTS`) whose
    kernel has not started yet: then `session_id` is None until its first use."""

    id: str
    language: str
    cwd: str
    session_id: str | None

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


def setup_code(language: str, env: dict[str, str], cwd: str) -> str | None:
    """Silent code that sets `env` (`env_code`) and moves into `cwd` in a kernel of
    `language` (a JSON string is a string literal in each of `CHDIR`'s languages); None when
    there is nothing to do."""
    lines = []
    if env and language in ENV_LANGUAGES:  # others (Java) cannot take them
        lines.append(env_code(language, env))
    if cwd != HOME:
        if language not in CHDIR:
            raise SandboxError(400, f"a working directory cannot be set for {language}")
        lines.append(CHDIR[language].format(path=json.dumps(cwd)))
    return "\n".join(lines) or None


async def equip(session: Session, env: dict[str, str], cwd: str = HOME) -> None:
    """The sandbox's environment variables and the context's working directory, in the
    session's kernel now and in every kernel that replaces it (a restart, a revival)."""
    code = setup_code(session.language, env, cwd)
    if code is None:
        return
    prepare_new_kernels(session, code)
    kernel = session.slot.kernel
    if kernel is not None and not await kernel.run_silent(code, SETUP_SECONDS):
        raise SandboxError(400, f"cannot set up the {session.language} context in {cwd!r}")


def prepare_new_kernels(session: Session, code: str) -> None:
    """`code` runs, silently, in every new kernel of `session` before any cell reaches it."""

    async def prepare(kernel: Kernel) -> None:
        if not await kernel.run_silent(code, SETUP_SECONDS):
            logger.warning("E2B context %s: its set-up failed in a new kernel", session.id)

    session.slot.prepare.append(prepare)
