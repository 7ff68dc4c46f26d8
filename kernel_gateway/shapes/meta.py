"""What a shape states beyond its Python type (a description, a bound, a format), without pydantic.

The response and event TypedDicts (`responses.py`, `events.py`) are imported by every producer
and by the cluster router, none of which needs pydantic. Their fields carry these markers;
each becomes pydantic's own (`Field`, `WithJsonSchema`, `AfterValidator`) only when pydantic
makes a schema or validates a value (`schema.py`, the tests), through the
`__get_pydantic_core_schema__` hook pydantic calls on `Annotated` metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

T = TypeVar("T")

CONFIG = {"extra": "forbid", "use_attribute_docstrings": True}
"""pydantic's config of every response shape: exactly the fields its TypedDict names."""


class _Lazy:
    """An `Annotated` marker standing for pydantic metadata made when first needed."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(Annotated[source, self._make()])


def field(**kwargs: Any) -> Any:
    """pydantic's `Field(**kwargs)`: a description, bounds, a discriminator."""

    def make() -> Any:
        from pydantic import Field

        return Field(**kwargs)

    return _Lazy(make)


def json_schema(schema: dict[str, Any]) -> Any:
    """pydantic's `WithJsonSchema(schema)`: the field's JSON Schema, as given."""

    def make() -> Any:
        from pydantic import WithJsonSchema

        return WithJsonSchema(schema)

    return _Lazy(make)


def after(check: Callable[[Any], Any]) -> Any:
    """pydantic's `AfterValidator(check)`: a check made when a value is validated."""

    def make() -> Any:
        from pydantic import AfterValidator

        return AfterValidator(check)

    return _Lazy(make)


def closed(cls: type[T]) -> type[T]:
    """A response shape: it holds exactly the fields its TypedDict names (pydantic's
    `with_config`, which only sets this attribute)."""
    setattr(cls, "__pydantic_config__", CONFIG)  # noqa: B010 (a TypedDict has no such field)
    return cls


Count = Annotated[int, field(ge=0)]
Milliseconds = Annotated[float, field(ge=0)]
Timestamp = Annotated[str, json_schema({"type": "string", "format": "date-time"})]
Base64Text = Annotated[str, json_schema({"type": "string", "contentEncoding": "base64"})]
