"""What the gateway ships for templates: the `python3.11` base, and templates built by name.

    python3.11          a base: `POST /templates {"base": "python3.11"}`, E2B's
                        `fromImage: "python3.11"` (or `from_python_image("3.11")`, which
                        sends `python:3.11`). It is the kernel image built again on Debian 12
                        (bookworm), whose Python is 3.11: `kernel-gateway-kernel-py311:latest`,
                        made by `kernel-gateway build-image --languages python3.11`. Its
                        kernels are the built-in Python kernel, version 3.11.
    shipped/NAME.json   a shipped template, exactly the body of `POST /templates`. The gateway
                        builds those `--builtin-templates` names at startup, in the background
                        (`start_builtin`): not when one is built already from the same
                        definition, or building, and not when its base image is missing (the
                        log says why). A template kept from an earlier gateway is reused.

`python-classic` is the classic stack on the 3.11 base: pandas 1.5, NumPy 1.26, SciPy 1.13,
matplotlib 3.7, for code written against the APIs pandas 2, NumPy 2 and SciPy 1.14 removed
(`DataFrame.append`, `np.in1d`, `interp2d`); those versions have no wheels for Python 3.13.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from kernel_gateway.errors import BackendUnavailable, GatewayError
from kernel_gateway.kernels.languages import Language, family_image
from kernel_gateway.tenants.principal import ADMIN

if TYPE_CHECKING:
    from kernel_gateway.templates.model import BuildSpec
    from kernel_gateway.templates.service import Templates

logger = logging.getLogger(__name__)

PYTHON311 = "python3.11"
"""The base's name, and what `build-image --languages` calls its image."""
PYTHON311_BASES = frozenset({PYTHON311, "python:3.11"})
PYTHON311_VERSION = "3.11"
PYTHON311_FAMILY = "py311"
"""Its image's suffix: `kernel-gateway-kernel:latest` -> `kernel-gateway-kernel-py311:latest`."""
FOLDER = "shipped"


def python311_image(kernel_image: str) -> str:
    """The Python 3.11 image that goes with the gateway's kernel image (`--image`)."""
    return family_image(kernel_image, PYTHON311_FAMILY)


def python311(python: Language, kernel_image: str) -> Language:
    """The built-in Python kernel (`python`), on the 3.11 image."""
    return dataclasses.replace(
        python, version=PYTHON311_VERSION, image=python311_image(kernel_image)
    )


def shipped() -> list[str]:
    """The names of the templates the gateway ships, sorted."""
    folder = files("kernel_gateway.templates").joinpath(FOLDER)
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def definition(name: str) -> dict[str, Any]:
    """The shipped template `name`: the body `POST /templates` takes (KeyError: none)."""
    if name not in shipped():
        raise KeyError(name)
    text = files("kernel_gateway.templates").joinpath(FOLDER, f"{name}.json").read_text()
    body: dict[str, Any] = json.loads(text)
    return body


def spec_of(body: dict[str, Any]) -> BuildSpec:
    """The build a shipped definition asks for, as `POST /templates` reads it (base and
    steps; no files: a shipped template copies none)."""
    from kernel_gateway.templates.model import BuildSpec
    from kernel_gateway.templates.steps import parse_steps

    base = str(body.get("base") or "python")
    return BuildSpec(
        base=base if base.startswith("template:") else f"image:{base}",
        steps=tuple(parse_steps(body.get("steps", []))),
        start_cmd=body.get("start_cmd"),
        ready_cmd=body.get("ready_cmd"),
    )


def start_builtin(templates: Templates | None, names: Sequence[str], backend: str) -> None:
    """Build the shipped templates `names` (`--builtin-templates`) in the background.

    A name that is not shipped stops the gateway's start (`BackendUnavailable`, as an
    unknown `--languages` does); a backend that builds no templates is logged."""
    if not names:
        return
    unknown = [name for name in names if name not in shipped()]
    if unknown:
        raise BackendUnavailable(
            f"--builtin-templates: no shipped template {', '.join(map(repr, unknown))}; "
            f"shipped: {', '.join(shipped())}"
        )
    if templates is None:
        logger.warning(
            "--builtin-templates: not building %s: the %s backend builds no templates "
            "(they need Docker)",
            ", ".join(names),
            backend,
        )
        return
    templates.spawn(_build_all(templates, list(names)), name="builtin templates")


async def _build_all(templates: Templates, names: list[str]) -> None:
    for name in names:  # one after the other: a build takes the machine's CPUs
        try:
            await _build_one(templates, name)
        except GatewayError as exc:
            logger.warning("--builtin-templates: %s not built: %s", name, exc.message)


async def _build_one(templates: Templates, name: str) -> None:
    body = definition(name)
    spec = spec_of(body)
    found = templates.find(name, ADMIN)  # the operator's: shared with every key
    if found is not None and found.building is not None:
        logger.info("--builtin-templates: %s is building already", name)
        return
    ready = found.ready if found is not None else None
    if ready is not None and ready.spec == spec:
        logger.info("--builtin-templates: %s is built (build %s)", name, ready.id)
        return
    image = templates.base_image(spec.base, ADMIN)
    assert templates.images is not None
    if await templates.images.inspect(image) is None:
        how = (
            f"kernel-gateway build-image --languages {PYTHON311}"
            if body.get("base") in PYTHON311_BASES
            else "kernel-gateway build-image"
        )
        logger.warning(
            "--builtin-templates: %s not built: its base image %s is not on this gateway "
            "(build it with `%s`, then restart the gateway)",
            name,
            image,
            how,
        )
        return
    template = templates.create(name, exist_ok=True, owner=ADMIN)
    build = templates.new_build(template, body.get("tags"))
    try:
        templates.start(template, build, spec)
    except BaseException:
        templates.discard(template, build)
        raise
    why = "its definition changed" if ready is not None else "not built yet"
    logger.info(
        "--builtin-templates: building %s (%s): GET /templates/%s/builds/%s/logs",
        name,
        why,
        name,
        build.id,
    )
    async for _ in templates.follow(build):
        pass
    if build.image is not None:
        logger.info("--builtin-templates: %s built: %s", name, build.image)
    else:
        logger.warning("--builtin-templates: %s failed: %s", name, build.reason)
