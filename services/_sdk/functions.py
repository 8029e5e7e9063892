"""Tools declared as Python functions: the schema from the type annotations, the description from the docstring.

    @tool
    async def cancel_ticket(ctx: ToolContext, ticket_id: Annotated[str, Entity("ticket")], reason: str = "") -> dict:
        '''Cancel one of the customer's open tickets; give the reason the customer gave.'''

The input is the typed parameters (or one pydantic model); a `ToolContext` parameter (or `ctx`) gets the context.
The document passes the registry's checks; a function that cannot be a tool is reported by them, never raised."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model
from pydantic.json_schema import GenerateJsonSchema

from roundtrip._sdk.context import ToolContext
from roundtrip._sdk.registry import Handler, ToolSpec, document_problems
from roundtrip._sdk.sources import ToolSource


@dataclass(frozen=True)
class Entity:
    """`Annotated[str, Entity("order")]`: this argument is the id of an entity of that kind (the gate resolves it)."""

    kind: str

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema: dict[str, Any] = handler(core_schema)
        schema["x-entity"] = self.kind
        return schema


class _NoTitles(GenerateJsonSchema):
    """pydantic's schema without a `title` on every field: noise for the model."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


@dataclass
class FunctionTool(ToolSource):
    """One Python function as a tool (a tool source of one tool): its document and its handler."""

    fn: Callable[..., Any]
    name: str
    description: str
    model: type[BaseModel] | None = None
    ctx_param: str | None = None
    as_model: str | None = None
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    faults: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.schema}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        assert self.model is not None
        value = self.model.model_validate(args)
        kwargs: dict[str, Any] = (
            {self.as_model: value} if self.as_model else {k: getattr(value, k) for k in type(value).model_fields}
        )
        if self.ctx_param:
            kwargs[self.ctx_param] = ctx
        result = await self.fn(**kwargs)
        return result.model_dump(mode="json") if isinstance(result, BaseModel) else result

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"tool function {getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.name)}"

    @cached_property
    def _checked(self) -> tuple[dict[str, ToolSpec], list[str]]:
        if self.model is None:
            return {}, list(self.faults)
        spec, found = document_problems(self.document(), self.label)
        if self.as_model and any("additionalProperties" in p for p in found):
            found.append(
                f"{self.label}: its model {self.model.__name__} needs model_config = ConfigDict(extra='forbid')"
            )
        return ({spec.name: spec} if spec is not None else {}), [*self.faults, *found]

    def specs(self) -> Mapping[str, ToolSpec]:
        return self._checked[0]

    def problems(self, kinds: Collection[str]) -> list[str]:
        return self._checked[1]

    def handlers(self) -> Mapping[str, Handler]:
        return {name: self for name in self.specs()}

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self(args, ctx)


def _line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _is_context(name: str, annotation: Any) -> bool:
    return annotation is ToolContext or (name == "ctx" and annotation is inspect.Parameter.empty)


def function_tool(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> FunctionTool:
    name = name or str(getattr(fn, "__name__", repr(fn)))
    made = FunctionTool(fn=fn, name=name, description=description or inspect.getdoc(fn) or "")
    if not inspect.iscoroutinefunction(fn):
        made.faults.append(f"tool {name}: the function must be `async def`")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
        params = list(inspect.signature(fn).parameters.values())
    except Exception as exc:  # noqa: BLE001 - e.g. an annotation naming a type that is not imported
        made.faults.append(f"tool {name}: its annotations cannot be read: {type(exc).__name__}: {_line(exc)}")
        return made
    fields: dict[str, Any] = {}
    for param in params:
        annotation = hints.get(param.name, inspect.Parameter.empty)
        if _is_context(param.name, annotation):
            made.ctx_param = param.name
        elif param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            made.faults.append(f"tool {name}: *{param.name} cannot be a tool argument (name each argument)")
        elif annotation is inspect.Parameter.empty:
            made.faults.append(f"tool {name}: argument {param.name!r} has no type annotation")
        else:
            fields[param.name] = (annotation, ... if param.default is param.empty else param.default)
    if len(fields) == 1 and isinstance(ann := next(iter(fields.values()))[0], type) and issubclass(ann, BaseModel):
        made.as_model, made.model = next(iter(fields)), ann
    else:
        try:
            made.model = create_model(f"{name}_input", __config__=ConfigDict(extra="forbid"), **fields)
        except Exception as exc:  # noqa: BLE001 - e.g. an argument named like a pydantic attribute
            made.faults.append(f"tool {name}: its arguments cannot be a model: {type(exc).__name__}: {_line(exc)}")
            return made
    try:
        made.schema = made.model.model_json_schema(schema_generator=_NoTitles)
    except Exception as exc:  # noqa: BLE001 - a type pydantic cannot put in a schema is the author's to fix
        made.faults.append(f"tool {name}: its arguments have no JSON Schema: {type(exc).__name__}: {_line(exc)}")
        made.model = None
        return made
    made.schema.pop("title", None)
    made.schema.setdefault("required", [])  # pydantic leaves it out when every argument has a default
    return made


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Declare a Python function as a tool: `@tool`, or `@tool(name=..., description=...)` to override either."""
    if fn is None:
        return lambda f: function_tool(f, name, description)
    return function_tool(fn, name, description)
