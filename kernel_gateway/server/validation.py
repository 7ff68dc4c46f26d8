"""Request bodies read as typed models (`kernel_gateway.sessions.models`).

Apart from `http.py` because it loads pydantic, which the cluster router (it imports
`http.py`) has no use for and does not load.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from kernel_gateway.server.http import read_json
from kernel_gateway.sessions.models import Limits, validate

M = TypeVar("M", bound=BaseModel)


async def read_model(
    request: Request, model: type[M], limit: int, limits: Limits, *, optional: bool = False
) -> M:
    """The JSON body (at most `limit` bytes; `optional`: may be empty) as a `model`.

    400 when it is not JSON, 413 when it is too large, 415 without a JSON content type,
    422 when it is not an object or `model` refuses it (413 for a file over the upload
    limit), with a message naming the field.
    """
    body = await read_json(request, limit, optional=optional)
    return validate(model, body, limits)
