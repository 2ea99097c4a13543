"""Modules KServe imports when it loads but serving never calls, imported on their first use instead.

`import kserve` runs its package's `__init__`, which imports pandas (for helpers that turn tensors
into DataFrames, `kserve.utils.utils` and `InferRequest.as_dataframe`) and the Kubernetes client (for
`KServeClient`, which talks to an API server). The predictor calls neither, yet the two cost about a
quarter of a second of a cold start's imports (`python -X importtime -c "import predictor.server"`),
spent on the main thread while the weights load (issue 26). `defer()` puts a stand-in module in
`sys.modules` for each, as Mercurial's demandimport does: the first attribute that needs the real
module imports it, puts it in `sys.modules` and answers from it from then on.

What KServe touches while it imports, before any call, is answered without the real module:
- `from kubernetes import client, config, watch` binds stand-ins of those submodules;
- `pd.DataFrame` in a signature's annotations gets a stand-in class: calling it builds a real
  DataFrame, and `isinstance(x, pd.DataFrame)` asks the real class once pandas is loaded (before
  that no DataFrame can exist, so the answer is False).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

# The package, the submodules `from package import name` binds at import time, the classes that
# appear in annotations evaluated at import time.
DEFERRED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pandas": ((), ("DataFrame",)),
    "kubernetes": (("client", "config", "watch"), ()),
}

_lock = threading.RLock()


class DeferredModule(types.ModuleType):
    """Stands in for module `name` until an attribute it does not hold is asked for."""

    def __init__(
        self, spec: importlib.machinery.ModuleSpec, submodules: tuple[str, ...], classes: tuple[str, ...]
    ):
        super().__init__(spec.name)
        # What the import system and introspection read without needing the module's code.
        self.__spec__ = spec
        self.__file__ = spec.origin
        if spec.submodule_search_locations is not None:
            self.__path__ = list(spec.submodule_search_locations)
        self.__package__ = spec.name if spec.submodule_search_locations is not None else spec.parent
        for sub in submodules:
            sub_spec = importlib.machinery.ModuleSpec(f"{spec.name}.{sub}", None, is_package=True)
            setattr(self, sub, DeferredModule(sub_spec, (), ()))
        for cls in classes:
            setattr(self, cls, _deferred_class(spec.name, cls))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # introspection (hasattr(m, "__path__"), ...) does not load
        return getattr(real(self.__name__), attr)

    def __repr__(self) -> str:
        return f"<deferred module {self.__name__!r}>"


def _deferred_class(module: str, name: str) -> type:
    class DeferredClassMeta(type):
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            return getattr(real(module), name)(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            loaded = loaded_class(module, name)
            return loaded is not None and isinstance(obj, loaded)

        def __subclasscheck__(cls, sub: type) -> bool:
            loaded = loaded_class(module, name)
            return loaded is not None and issubclass(sub, loaded)

    return DeferredClassMeta(name, (), {"__module__": module, "__qualname__": name})


def loaded_class(module: str, name: str) -> type | None:
    """`module.name` if the real module is loaded, without loading it."""
    found = sys.modules.get(module)
    return None if found is None or isinstance(found, DeferredModule) else getattr(found, name)


def real(name: str) -> types.ModuleType:
    """The real module `name` (a submodule of a deferred package included), imported on first call."""
    with _lock:
        found = sys.modules.get(name)
        if found is not None and not isinstance(found, DeferredModule):
            return found
        # The whole package steps aside first: the real submodules import the real package.
        root = name.split(".")[0]
        stand_in = sys.modules.get(root)
        if isinstance(stand_in, DeferredModule):
            del sys.modules[root]
        try:
            return importlib.import_module(name)
        except BaseException:
            if stand_in is not None and root not in sys.modules:
                sys.modules[root] = stand_in
            raise


def defer(names: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = DEFERRED) -> list[str]:
    """Put stand-ins in sys.modules for those of `names` installed and not yet imported; returns them."""
    done = []
    with _lock:
        for name, (submodules, classes) in names.items():
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None:  # not installed: whoever imports it gets the ImportError as before
                continue
            sys.modules[name] = DeferredModule(spec, submodules, classes)
            done.append(name)
    return done
