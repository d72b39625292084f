"""Component slots: recipe fields that hold a registered component (``attention``, ``position``,
``norm``, ``ffn``), validated by the params model of the type they name, so the schema grows with
the registry (schema only, no tensors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, TypeVar, get_args

from pydantic import SerializeAsAny, WrapValidator
from pydantic_core import PydanticCustomError

from tfbuilder import registry
from tfbuilder.errors import did_you_mean
from tfbuilder.params import AttentionParams, ComponentParams, PositionParams

P = TypeVar("P", bound=ComponentParams)


def unknown_type(family: str, name: object, names: list[str]) -> PydanticCustomError:
    """The error for a ``type`` that names no registered ``family`` component (with a did-you-mean)."""
    return PydanticCustomError(
        "component_type_unknown",
        "unknown {family} type '{name}'{hint}",
        {"family": family, "name": str(name), "hint": did_you_mean(str(name), names)},
    )


class _Dispatch:
    """Validates a component slot with the params model of the registered type it names."""

    def __init__(self, family: str):
        self.family = family

    def __call__(self, value: Any, handler: Any) -> ComponentParams:
        if isinstance(value, ComponentParams):
            if value.family != self.family:
                raise PydanticCustomError("component_family", "expected a {family} component", {"family": self.family})
            return value
        names = registry.types(self.family)
        if isinstance(value, str):
            value = {"type": value}  # shorthand: `position: learned` means `position: {type: learned}`
        if not isinstance(value, dict):
            raise PydanticCustomError(
                "component_mapping",
                "expected a mapping with a 'type' key (one of: {names}), got {got}",
                {"names": ", ".join(names), "got": repr(value)},
            )
        name = value.get("type")
        if name is None:
            raise PydanticCustomError(
                "component_type_missing", "missing 'type' (one of: {names})", {"names": ", ".join(names)}
            )
        if not isinstance(name, str) or name not in names:
            raise unknown_type(self.family, name, names)
        return registry.get(self.family, name).params.model_validate(value)

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        members = [inline_definitions(e.params.model_json_schema()) for e in registry.entries(self.family)]
        shorthand = {"type": "string", "enum": registry.types(self.family), "description": "shorthand for {type: NAME}"}
        return {
            # anyOf, not oneOf: a mapping with only `type` matches more than one member's schema.
            "anyOf": [*members, shorthand],
            "description": f"a registered {self.family} component: " + ", ".join(registry.types(self.family)),
        }


def inline_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` (the models a component's params nest, e.g. rotary's ``scaling``)
    written in place of their ``$ref``s: a member of a slot's schema sits inside the recipe's schema,
    where its own ``#/$defs/...`` would point at the recipe's. Its discriminators' mappings, which
    name those refs, are dropped (the members' ``type`` constants still tell them apart)."""
    definitions = schema.get("$defs", {})

    def inlined(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[len("#/$defs/") :] in definitions:
                return inlined(definitions[ref[len("#/$defs/") :]])
            return {k: inlined(v) for k, v in node.items() if k not in ("$defs", "discriminator")}
        if isinstance(node, list):
            return [inlined(item) for item in node]
        return node

    result: dict[str, Any] = inlined(schema)
    return result


def slot(family: str) -> Any:
    """The annotation of a field that holds a registered component of ``family``."""
    dispatch = _Dispatch(family)
    return Annotated[SerializeAsAny[ComponentParams], WrapValidator(dispatch), dispatch]


def default_component(family: str, name: str, base: type[P]) -> Callable[[], P]:
    """A field's default factory: the registered ``family`` type ``name`` with its default params
    (a ``base``, the params class the field's type promises)."""

    def make() -> P:
        params = registry.get(family, name).params.model_validate({"type": name})
        if not isinstance(params, base):
            raise TypeError(f"the default {family} type '{name}' has params that are not {base.__name__}")
        return params

    return make


if TYPE_CHECKING:
    # To the type checker a slot holds its family's params: what the contract (tfbuilder.contracts)
    # has every registered type's Params provide (attention: shape; position: max_positions).
    Attention: TypeAlias = AttentionParams
    Position: TypeAlias = PositionParams
    Norm: TypeAlias = ComponentParams
    Ffn: TypeAlias = ComponentParams
else:
    Attention = slot("attention")
    Position = slot("position")
    Norm = slot("norm")
    Ffn = slot("ffn")


def slot_family(things: tuple) -> str | None:
    """The family of the component slot among ``things`` (a field's annotation and metadata, searched
    through their type arguments), or None when none is a slot."""
    for thing in things:
        if isinstance(thing, _Dispatch):
            return thing.family
        if isinstance(thing, WrapValidator) and isinstance(thing.func, _Dispatch):
            return thing.func.family
        found = slot_family(get_args(thing)) if get_args(thing) else None
        if found:
            return found
    return None


def merged_params(base: ComponentParams, change: dict[str, Any]) -> ComponentParams:
    """``base`` changed by the partial mapping ``change``: merged over its params, or, when ``change``
    names another type, that type from its defaults; validated by the type's params model."""
    name = change.get("type", base.type)
    names = registry.types(base.family)
    if not isinstance(name, str) or name not in names:
        raise unknown_type(base.family, name, names)
    data = {**base.model_dump(), **change} if name == base.type else dict(change)
    return registry.get(base.family, name).params.model_validate(data)
