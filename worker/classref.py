"""Moving actor classes to procs: by reference where importable, by value otherwise.

A proc is started by the host agent, not by the user's program, so it does not
share the program's `sys.path` or `__main__`. The reference carries both, and the
by-value copy is the fallback when the import fails there.
"""

from __future__ import annotations

import importlib
import pickle
import sys
import threading
import types
from typing import Any

import cloudpickle

_by_value_lock = threading.Lock()


def class_ref(cls: type) -> dict:
    """A msgpack-able description of cls that a proc can turn back into the class."""
    module = cls.__module__
    qual = cls.__qualname__
    ref: dict[str, Any] = {"mod": module, "qual": qual, "path": [p for p in sys.path if p]}
    if module == "__main__" or "<locals>" in qual:
        ref["blob"] = cloudpickle.dumps(cls, protocol=5)
        ref["mod"] = None
        return ref
    mod = sys.modules.get(module)
    with _by_value_lock:
        try:
            cloudpickle.register_pickle_by_value(mod)
            ref["blob"] = cloudpickle.dumps(cls, protocol=5)
        except (ValueError, TypeError, pickle.PicklingError):
            ref["blob"] = None
        finally:
            try:
                cloudpickle.unregister_pickle_by_value(mod)
            except ValueError:
                pass
    return ref


def modules_of(cls: type) -> list[str]:
    """The modules a proc imports to load `cls`: its own, when importable by name, and those its
    methods use as globals (what unpickling a by-value copy imports). What a warm proc preloads."""
    names = [] if cls.__module__ == "__main__" else [cls.__module__]
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        for value in vars(klass).values():
            fn = getattr(value, "__func__", value)
            code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
            if code is None or not isinstance(scope, dict):
                continue
            names += [m.__name__ for n in code.co_names if isinstance(m := scope.get(n), types.ModuleType)]
    return [n for n in dict.fromkeys(names) if n != "__main__"]


def load_class(ref: dict) -> type:
    """Resolve a class_ref inside a proc. Raises ImportError naming the class."""
    module, qual, blob = ref.get("mod"), ref.get("qual"), ref.get("blob")
    if module:
        for p in ref.get("path") or []:
            if isinstance(p, str) and p not in sys.path:
                sys.path.append(p)
        try:
            obj: Any = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, type):
                return obj
        except (ImportError, AttributeError):
            if not blob:
                raise
    if not blob:
        raise ImportError(f"cannot load actor class {module}.{qual}: not importable and no copy sent")
    cls = pickle.loads(blob)
    if not isinstance(cls, type):
        raise ImportError(f"actor class {qual} did not unpickle to a class")
    return cls
