"""The component registry: family -> type name -> component class with its strict ``Params`` model.

Components register themselves with :func:`register`; third-party packages do the same from Python
or through the entry-point group ``tfbuilder.components`` (a recipe only ever names a registered
type, never an import path). This module imports no component; the types a component is built from
(:class:`ComponentParams`, :class:`BuildContext`, ...) are the contract's (:mod:`tfbuilder.contracts`),
re-exported here.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Literal, TypeVar, get_args, get_origin

from tfbuilder.contracts import (  # noqa: F401 (re-exported: what a component is built from)
    AuxiliaryLoss,
    BuildContext,
    ComponentParams,
    ModelDims,
    RoutingBalance,
    StackShared,
)
from tfbuilder.contracts import missing as lacking
from tfbuilder.version import __version__

if TYPE_CHECKING:  # only named in annotations
    from torch.nn import Module

FAMILIES: tuple[str, ...] = ("attention", "position", "norm", "ffn")
ENTRY_POINT_GROUP = "tfbuilder.components"
_BUILTIN_MODULES = (
    "tfbuilder.model.components.attention",
    "tfbuilder.model.components.differential",
    "tfbuilder.model.components.latent_attention",
    "tfbuilder.model.components.position",
    "tfbuilder.model.components.norm",
    "tfbuilder.model.components.ffn",
    "tfbuilder.model.components.moe",
)


@dataclass(frozen=True)
class Entry:
    """A registered component: its family, type name, class and params model."""

    family: str
    name: str
    cls: type
    params: type[ComponentParams]
    source: str
    package: str | None = None  # the installed distribution that registered it ("tfbuilder" for built-ins)
    package_version: str | None = None
    plugin: str | None = None  # the --plugins file or module that registered it (tfbuilder.plugins)

    @property
    def doc(self) -> str:
        """The docstring's first paragraph on one line (whole sentences: what it is, the paper)."""
        first = (self.cls.__doc__ or "").strip().split("\n\n")[0]
        return " ".join(first.split())


class RegistryError(Exception):
    """A component cannot be registered (a programming error in a component, not a recipe error)."""


_entries: dict[str, dict[str, Entry]] = {family: {} for family in FAMILIES}
_loaded = False
_provider: tuple[str | None, str | None] = (None, None)  # the distribution whose entry point is loading
_plugin: str | None = None  # the --plugins file or module being imported (set by tfbuilder.plugins)
C = TypeVar("C", bound=type)


def register(family: str, name: str) -> Callable[[C], C]:
    """Class decorator: register ``cls`` as ``family``/``name``.

    ``cls`` must define a nested ``Params(ComponentParams)`` whose ``type`` field is
    ``Literal[name]`` with default ``name``, be constructible as ``cls(params, ctx)``, and satisfy its
    family's contract (:mod:`tfbuilder.contracts`).
    """

    def decorate(cls: C) -> C:
        _add(family, name, cls, source=cls.__module__)
        return cls

    return decorate


def _add(family: str, name: str, cls: type, *, source: str) -> None:
    if family not in FAMILIES:
        raise RegistryError(f"unknown family '{family}' (families: {', '.join(FAMILIES)})")
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, ComponentParams)):
        raise RegistryError(f"{cls.__name__} must define a nested Params(ComponentParams)")
    field = params.model_fields.get("type")
    annotation = field.annotation if field else None
    if (
        field is None
        or get_origin(annotation) is not Literal
        or get_args(annotation) != (name,)
        or field.default != name
    ):
        raise RegistryError(f"{cls.__name__}.Params.type must be declared as: type: Literal['{name}'] = '{name}'")
    for pname, pfield in params.model_fields.items():
        if pname != "type" and not pfield.description:
            raise RegistryError(f"{cls.__name__}.Params.{pname} needs a description")
    existing = _entries[family].get(name)
    if existing is not None:
        raise RegistryError(
            f"{family} type '{name}' is already registered by {existing.source} ({existing.cls.__name__})"
        )
    absent = lacking(family, cls)
    if absent:
        raise RegistryError(
            f"{cls.__name__} does not satisfy the {family} contract (tfbuilder.contracts): it lacks "
            + "; ".join(absent)
        )
    params.family = family
    package, package_version = ("tfbuilder", _own_version()) if source.startswith("tfbuilder.") else _provider
    _entries[family][name] = Entry(family, name, cls, params, source, package, package_version, _plugin)


def unregister(family: str, name: str) -> None:
    """Remove a registration (for tests and interactive work)."""
    del _entries[family][name]


def load() -> None:
    """Import the built-in components and the installed plugins, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    load_plugins()


def load_plugins() -> list[str]:
    """Load every entry point of group ``tfbuilder.components``; returns the names loaded.

    A plugin that fails to import is reported as a warning and skipped, so one broken package
    does not break every recipe.
    """
    global _provider
    loaded = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        # What registers while the entry point loads is recorded as this distribution's (checkpoints
        # keep it, so that loading one without the package can say which to install).
        _provider = (ep.dist.name, ep.dist.version) if ep.dist is not None else (None, None)
        try:
            target = ep.load()
            if callable(target) and not isinstance(target, type):
                target()  # an entry point may name a function that registers components
        except Exception as exc:  # a broken third-party package must not take tfbuilder down
            warnings.warn(f"tfbuilder plugin '{ep.name}' ({ep.value}) failed to load: {exc}", stacklevel=2)
            continue
        finally:
            _provider = (None, None)
        loaded.append(ep.name)
    return loaded


def _own_version() -> str:
    return __version__


def provenance(params: list[ComponentParams]) -> list[dict[str, str | None]]:
    """Where each component type of ``params`` comes from: family, type, module, and the package
    (with its version) that registered it; one record per distinct type, sorted."""
    records = set()
    for p in params:
        entry = get(p.family, p.type)
        records.add((entry.family, entry.name, entry.source, entry.package, entry.package_version, entry.plugin))
    keys = ("family", "type", "module", "package", "version", "plugin")
    out = [dict(zip(keys, record, strict=True)) for record in sorted(records, key=lambda r: tuple(str(x) for x in r))]
    for record in out:  # "plugin" only where a --plugins file or module registered the type
        if record["plugin"] is None:
            del record["plugin"]
    return out


def missing(records: list[dict]) -> list[str]:
    """For recorded components (see :func:`provenance`) not registered here: what to install."""
    load()
    problems = []
    for r in records:
        if not isinstance(r, dict) or r.get("family") not in FAMILIES or r.get("type") in _entries[r["family"]]:
            continue
        if r.get("plugin"):
            problems.append(
                f"{r['family']} type '{r['type']}' was registered by the plugin {r['plugin']}, "
                "which is not loaded; that path comes from the checkpoint, and --plugins runs the file's code: "
                f"read it first, and if you trust it, pass --plugins {r['plugin']}"
            )
        elif r.get("package"):
            need = (
                f"pip install '{r['package']}=={r['version']}'" if r.get("version") else f"pip install '{r['package']}'"
            )
            package = f"{r['package']} {r.get('version') or ''}".rstrip()
            problems.append(
                f"{r['family']} type '{r['type']}' comes from the package {package}, "
                f"which is not installed here: {need}"
            )
        else:
            problems.append(
                f"{r['family']} type '{r['type']}' was registered by the module {r.get('module')} "
                "(not an installed package): import it before loading"
            )
    return problems


def get(family: str, name: str) -> Entry:
    load()
    return _entries[family][name]


def types(family: str) -> list[str]:
    """The registered type names of ``family``, sorted."""
    load()
    return sorted(_entries[family])


def entries(family: str) -> list[Entry]:
    load()
    return [_entries[family][n] for n in sorted(_entries[family])]


def build(family: str, params: ComponentParams, ctx: BuildContext) -> Module:
    """Instantiate the component that ``params`` describes (an ``nn.Module`` satisfying its family's
    contract, :mod:`tfbuilder.contracts`)."""
    return get(family, params.type).cls(params, ctx)
