"""`env_code`: environment variables in each language's code, quoted so values round-trip.

Python's and Bash's code is run for real (the values read back from a process's
environment); R's and Deno's is checked as text (a JSON string is their string literal),
and Deno's also run by node when it is installed (`Deno.env` shimmed).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from kernel_gateway.kernels.languages import BUILTIN_PYTHON, ENV_LANGUAGES, Language, env_code

VALUES = {
    "SINGLE": "it's",
    "DOUBLE": 'say "hi"',
    "BACKSLASH": "C:\\path\\n\\\\",
    "DOLLAR": "$HOME ${PATH} $(echo no) `echo no` $'x'",
    "NEWLINES": "one\ntwo\r\n\n",
    "UNICODE": "café ☕ 😀 \u2028 日本",
    "EMPTY": "",
    "SPACES": "  lead and trail  ",
    "SHELL": "'; echo injected; '",
    "DASH": "-n",
    "GLOB": "* ? [a] ~",
    "CONTROL": "tab\tbell\x07esc\x1b",
}

DUMP = "import json, os, sys; sys.stdout.write(json.dumps(dict(os.environ)))"
"""A program that writes its whole environment as JSON."""


def _environment_after(argv: list[str]) -> dict[str, str]:
    done = subprocess.run(
        argv, capture_output=True, check=True, env={"GONE": "was here", "PATH": "/usr/bin:/bin"}
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_python_values_round_trip_through_a_real_interpreter() -> None:
    code = env_code("python", {**VALUES, "GONE": None})
    seen = _environment_after([sys.executable, "-c", code + "\n" + DUMP])
    assert {k: seen.get(k) for k in VALUES} == VALUES
    assert "GONE" not in seen


def test_python_code_leaves_no_name_behind() -> None:
    namespace: dict[str, object] = {}
    exec(env_code("python", {"KG_TEST_ENV_CODE": "x", "KG_TEST_ENV_NONE": None}), namespace)
    assert set(namespace) == {"__builtins__"}


def test_bash_values_round_trip_through_a_real_shell() -> None:
    code = env_code("bash", {**VALUES, "GONE": None})
    script = code + "\nexec " + shlex.join([sys.executable, "-c", DUMP])
    seen = _environment_after(["bash", "-c", script])
    assert {k: seen.get(k) for k in VALUES} == VALUES
    assert "GONE" not in seen


def test_bash_leaves_plain_values_unquoted() -> None:
    assert env_code("bash", {"HTTP_PROXY": "http://127.0.0.1:3128"}) == (
        "export HTTP_PROXY=http://127.0.0.1:3128"
    )
    assert env_code("bash", {"A": ""}) == "export A=''"


def _literals(line: str) -> list[str]:
    """The double-quoted string literals of one line, read as JSON strings."""
    return [json.loads(m) for m in re.findall(r'"(?:[^"\\]|\\.)*"', line)]


def test_r_sets_and_unsets_with_string_literals() -> None:
    code = env_code("r", {**VALUES, "GONE": None})
    lines = code.split("\n")
    assert len(lines) == len(VALUES) + 1  # one call a line: no raw newline in a literal
    for line, (name, value) in zip(lines, VALUES.items(), strict=False):
        assert line.startswith("Sys.setenv(") and line.endswith(")")
        assert _literals(line) == [name, value]
    assert lines[-1] == 'Sys.unsetenv("GONE")'
    assert "😀" in code and "\\ud83d" not in code  # R has no surrogate pairs


@pytest.mark.parametrize("language", ["javascript", "typescript"])
def test_deno_sets_and_deletes_with_string_literals(language: str) -> None:
    code = env_code(language, {**VALUES, "GONE": None})
    lines = code.split("\n")
    assert len(lines) == len(VALUES) + 1
    for line, (name, value) in zip(lines, VALUES.items(), strict=False):
        assert line.startswith("Deno.env.set(") and line.endswith(");")
        assert _literals(line) == [name, value]
    assert lines[-1] == 'Deno.env.delete("GONE");'


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_deno_code_runs_as_javascript() -> None:
    shim = "const seen = {GONE: 'x'}; const Deno = {env: {set: (k, v) => { seen[k] = v; }, "
    shim += "delete: (k) => { delete seen[k]; }}};\n"
    code = env_code("javascript", {**VALUES, "GONE": None})
    program = shim + code + "\nprocess.stdout.write(JSON.stringify(seen));"
    done = subprocess.run(["node", "-e", program], capture_output=True, check=True)
    assert json.loads(done.stdout) == VALUES


def test_no_variables_no_code_and_java_has_none() -> None:
    assert all(env_code(language, {}) == "" for language in ENV_LANGUAGES)
    with pytest.raises(ValueError, match="java"):
        env_code("java", {"A": "1"})


def test_the_language_object_writes_its_own() -> None:
    assert BUILTIN_PYTHON.env_code({"A": "1"}) == env_code("python", {"A": "1"})
    bash = Language("bash", "Bash", kernelspec="/opt/kernel/kernelspecs/bash/kernel.json")
    assert bash.env_code({"A": "a b"}) == "export A='a b'"
