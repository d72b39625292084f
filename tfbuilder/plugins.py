"""User code that registers components, named on the command line: ``--plugins FILE_OR_MODULE``.

The command-line counterpart of the ``tfbuilder.components`` entry points (and of fairseq's
``--user-dir``): a Python file (``my_ffn.py``) or an importable module (``mylab.components``) is
imported before the recipe is read, so that the types it registers (:func:`tfbuilder.register`) can
be named in the recipe. A recipe never names code to import; only the person running the command
does. Checkpoints record which plugin registered each component type they use, and loading one
without it says which ``--plugins`` to pass.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from tfbuilder import registry
from tfbuilder.errors import TfbuilderError

_loaded: dict[str, ModuleType] = {}  # what each plugin was recorded as -> its module (each imported once)


class PluginError(TfbuilderError):
    """A ``--plugins`` file or module cannot be found or fails to import."""


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec or Path(spec).is_file()


def name_of(spec: str) -> str:
    """How a plugin is recorded (in checkpoints, in messages): a file by its absolute path, a module by its name."""
    return str(Path(spec).expanduser().resolve()) if _is_file(spec) else spec


def load(specs: Iterable[str]) -> list[ModuleType]:
    """Import each plugin once (built-in components and entry points first); what it registers is
    recorded as coming from it. A missing file, an unknown module or an import that fails is a
    :class:`PluginError` naming the plugin, and for a failure the line it failed at."""
    registry.load()
    modules = []
    for spec in specs:
        key = name_of(spec)
        if key not in _loaded:
            _loaded[key] = _import(spec, key)
        modules.append(_loaded[key])
    return modules


def _import(spec: str, key: str) -> ModuleType:
    registry._plugin = key
    try:
        if _is_file(spec):
            path = Path(key)
            if not path.is_file():
                raise PluginError(f"--plugins {spec}: no such file")
            # A module name of its own per file: two plugins named components.py do not collide.
            name = f"tfbuilder_plugin_{path.stem}_{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise PluginError(f"--plugins {spec}: not a Python file")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return module
        try:
            return importlib.import_module(spec)
        except ModuleNotFoundError as exc:
            if exc.name and spec.split(".")[0] == exc.name.split(".")[0] and spec.startswith(exc.name):
                raise PluginError(f"--plugins {spec}: no such module (and no such file)") from None
            raise
    except PluginError:
        raise
    except SystemExit as exc:  # the plugin's own exit would end the command as if it had succeeded
        raise PluginError(
            f"--plugins {spec}: its code called sys.exit({exc.code!r}) while it was imported "
            "(a plugin registers components; it does not end the command)"
        ) from None
    except Exception as exc:  # noqa: BLE001 (a plugin may raise anything; say where, no traceback)
        # Where in the plugin it failed (its own file's innermost line), else the innermost line.
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        own = [f for f in frames if f.filename == key] or frames[-1:]
        at = f"{own[-1].filename}:{own[-1].lineno}: " if own else ""
        raise PluginError(f"--plugins {spec}: failed to import: {at}{type(exc).__name__}: {exc}") from None
    finally:
        registry._plugin = None


def loaded() -> list[str]:
    """The plugins loaded in this process, as recorded."""
    return list(_loaded)


__all__ = ["PluginError", "load", "loaded", "name_of"]
