"""A template's build steps (kernel_gateway/templates/steps.py): what is taken, what not.

The good steps are the ones E2B's SDK sends (its `Template()` builder's args, "" for an
absent COPY user or mode); each refusal names the step, numbered from 1.
"""

from __future__ import annotations

import pytest

from kernel_gateway.errors import InvalidRequest
from kernel_gateway.templates.steps import MAX_ARG_BYTES, MAX_STEPS, Step, parse_steps

HASH = "0123456789abcdef" * 4


def refusal(raw: object) -> str:
    with pytest.raises(InvalidRequest) as caught:
        parse_steps(raw)
    return caught.value.message


def test_the_steps_e2bs_sdk_sends() -> None:
    raw: list[object] = [
        {"type": "USER", "args": ["root"], "force": False, "forceUpload": None},
        {"type": "WORKDIR", "args": ["/"], "force": False},
        {"type": "RUN", "args": ["apt-get update && apt-get install -y curl"]},
        {"type": "RUN", "args": ["pip install numpy", "root"]},
        {
            "type": "COPY",
            "args": ["requirements.txt", "/app/", "", ""],
            "filesHash": HASH,
            "force": True,
            "resolveSymlinks": None,
        },
        {"type": "COPY", "args": ["src/*.py", "./", "app:app", "0755"], "filesHash": HASH},
        {"type": "COPY", "args": ["./data/..hidden", "/d"], "filesHash": HASH},  # not `..`
        {"type": "ENV", "args": ["A", "1", "B", "two words", "EMPTY", ""]},
        {"type": "USER", "args": ["1000:1000"]},
        {"type": "run", "args": ["echo lower-case type"]},
    ]
    steps = parse_steps(raw)
    assert steps[0] == Step("USER", ("root",))
    assert steps[3] == Step("RUN", ("pip install numpy", "root"))
    assert steps[4] == Step("COPY", ("requirements.txt", "/app/", "", ""), HASH, force=True)
    assert steps[5].args == ("src/*.py", "./", "app:app", "0755")
    assert steps[7].args == ("A", "1", "B", "two words", "EMPTY", "")
    assert steps[9].type == "RUN"
    assert [s.to_json() for s in steps][4] == {
        "type": "COPY",
        "args": ["requirements.txt", "/app/", "", ""],
        "filesHash": HASH,
        "force": True,
    }


def test_no_steps() -> None:
    assert parse_steps(None) == []
    assert parse_steps([]) == []


def test_describe_names_a_step_briefly() -> None:
    (run, copy) = parse_steps(
        [
            {"type": "RUN", "args": ["pip install x", "root"]},
            {"type": "COPY", "args": ["a", "/b", "app", "0644"], "filesHash": HASH},
        ]
    )
    assert run.describe() == "RUN pip install x root"
    assert copy.describe() == "COPY a /b"
    (long,) = parse_steps([{"type": "RUN", "args": ["x" * 500]}])
    assert len(long.describe()) == 200


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "RUN", "args": ["x"]}, "steps must be a list of {type, args} objects"),
        ("RUN x", "steps must be a list of {type, args} objects"),
        (["RUN x"], "step 1: must be an object with a type and args"),
        (
            [{"type": "RUN", "args": ["x"]}, {"type": "FROM", "args": ["python"]}],
            "step 2: unknown step type 'FROM'; the types are RUN, COPY, ENV, WORKDIR, USER",
        ),
        (
            [{"args": ["x"]}],
            "step 1: unknown step type None; the types are RUN, COPY, ENV, WORKDIR, USER",
        ),
        ([{"type": "RUN", "args": "echo hi"}], "step 1: args must be a list of strings"),
        ([{"type": "RUN", "args": {"0": "x"}}], "step 1: args must be a list of strings"),
        ([{"type": "RUN", "args": ["x", 1]}], "step 1: args must be a list of strings"),
        ([{"type": "RUN"}], "step 1: RUN takes [command] or [command, user]"),
        ([{"type": "RUN", "args": ["  "]}], "step 1: RUN takes [command] or [command, user]"),
        (
            [{"type": "RUN", "args": ["a", "b", "c"]}],
            "step 1: RUN takes [command] or [command, user]",
        ),
        ([{"type": "RUN", "args": ["x", "bad user"]}], "step 1: 'bad user' is not a user name"),
        (
            [{"type": "RUN", "args": ["a\x00b"]}],
            f"step 1: an argument is over {MAX_ARG_BYTES} bytes or holds a NUL",
        ),
        (
            [{"type": "RUN", "args": ["x" * (MAX_ARG_BYTES + 1)]}],
            f"step 1: an argument is over {MAX_ARG_BYTES} bytes or holds a NUL",
        ),
        ([{"type": "RUN", "args": ["x"], "force": "yes"}], "step 1: force must be true or false"),
        (
            [{"type": "COPY", "args": ["a", "/b"]}],
            "step 1: COPY needs the filesHash of its uploaded files",
        ),
        (
            [{"type": "COPY", "args": ["a", "/b"], "filesHash": "ABC"}],
            "step 1: filesHash must be 64 lowercase hex digits (a SHA-256)",
        ),
        (
            [{"type": "COPY", "args": ["a", "/b"], "filesHash": HASH.upper()}],
            "step 1: filesHash must be 64 lowercase hex digits (a SHA-256)",
        ),
        (
            [{"type": "COPY", "args": ["a"], "filesHash": HASH}],
            "step 1: COPY takes [src, dest, user?, mode?]",
        ),
        (
            [{"type": "COPY", "args": ["", "/b"], "filesHash": HASH}],
            "step 1: COPY takes [src, dest, user?, mode?]",
        ),
        (
            [{"type": "COPY", "args": ["../x", "/b"], "filesHash": HASH}],
            "step 1: COPY source '../x' is outside the build context",
        ),
        (
            [{"type": "COPY", "args": ["a/../../x", "/b"], "filesHash": HASH}],
            "step 1: COPY source 'a/../../x' is outside the build context",
        ),
        (
            [{"type": "COPY", "args": ["..\\x", "/b"], "filesHash": HASH}],
            "step 1: COPY source '..\\\\x' is outside the build context",
        ),
        (
            [{"type": "COPY", "args": ["/etc", "/b"], "filesHash": HASH}],
            "step 1: COPY source '/etc' is outside the build context",
        ),
        (
            [{"type": "COPY", "args": ["a", "/b", "", "755x"], "filesHash": HASH}],
            "step 1: COPY mode must be octal like 0755, got '755x'",
        ),
        (
            [{"type": "COPY", "args": ["a", "/b", "", "0999"], "filesHash": HASH}],
            "step 1: COPY mode must be octal like 0755, got '0999'",
        ),
        (
            [{"type": "COPY", "args": ["a", "/b", "x y", ""], "filesHash": HASH}],
            "step 1: 'x y' is not a user name",
        ),
        ([{"type": "ENV", "args": []}], "step 1: ENV takes [key, value, key, value, ...]"),
        (
            [{"type": "ENV", "args": ["A", "1", "B"]}],
            "step 1: ENV takes [key, value, key, value, ...]",
        ),
        (
            [{"type": "ENV", "args": ["MY-VAR", "1"]}],
            "step 1: ENV name 'MY-VAR' is not a valid variable name",
        ),
        (
            [{"type": "ENV", "args": ["1ST", "1"]}],
            "step 1: ENV name '1ST' is not a valid variable name",
        ),
        ([{"type": "WORKDIR", "args": []}], "step 1: WORKDIR takes [path]"),
        ([{"type": "WORKDIR", "args": [""]}], "step 1: WORKDIR takes [path]"),
        ([{"type": "USER", "args": ["a", "b"]}], "step 1: USER takes [name]"),
        ([{"type": "USER", "args": [""]}], "step 1: '' is not a user name"),
        (
            [{"type": "USER", "args": ["root; rm -rf /"]}],
            "step 1: 'root; rm -rf /' is not a user name",
        ),
        ([{"type": "USER", "args": ["app:"]}], "step 1: 'app:' is not a user name"),
        ([{"type": "USER", "args": ["a:b:c"]}], "step 1: 'a:b:c' is not a user name"),
    ],
)
def test_refused(raw: object, message: str) -> None:
    assert refusal(raw) == message


@pytest.mark.parametrize(
    "user", ["root", "user", "app_1", "www-data", "1000", "1000:1000", "app:app", "app:1000"]
)
def test_user_names(user: str) -> None:
    """A name or id, optionally `:group` (E2B's `copy(user="app:app")`, Docker's --chown)."""
    (step,) = parse_steps([{"type": "USER", "args": [user]}])
    assert step.args == (user,)
    (copied,) = parse_steps([{"type": "COPY", "args": ["a", "/b", user, ""], "filesHash": HASH}])
    assert copied.args[2] == user


def test_the_first_bad_step_is_named() -> None:
    raw = [{"type": "RUN", "args": ["ok"]}] * 4 + [{"type": "USER", "args": ["no way"]}]
    assert refusal(raw) == "step 5: 'no way' is not a user name"


def test_at_most_max_steps() -> None:
    assert len(parse_steps([{"type": "RUN", "args": ["x"]}] * MAX_STEPS)) == MAX_STEPS
    assert refusal([{"type": "RUN", "args": ["x"]}] * (MAX_STEPS + 1)) == (
        f"a template has at most {MAX_STEPS} steps, got {MAX_STEPS + 1}"
    )
