"""What a user's training step is, for the profile cache: a digest that follows the code it runs (what
it covers and what not: docs/howto/bring-your-own.md, "The step")."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

MAX_DEPTH = 12
MAX_ITEMS = 64
_LIBRARY_ROOTS = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
)
_PROJECT = ("powerfed", "powerctl", "strategies", "fl_server", "fl_client", "simulations")


def step_identity(obj: Any) -> str:
    """A sha256 digest of what `obj` (a step factory, a class) runs."""
    text = json.dumps(_describe(obj, set(), 0), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _is_library(obj: Any) -> bool:
    """Code versioned with an installed package, the standard library or this project: named, not read."""
    module_name = getattr(obj, "__module__", None) or ""
    if module_name.split(".")[0] in (*_PROJECT, "builtins", "torch"):
        return True
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None or path is None:
        return module_name in sys.builtin_module_names
    return str(Path(path).resolve()).startswith(_LIBRARY_ROOTS)


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _describe(obj: Any, seen: set[int], depth: int) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return repr(obj)
    if isinstance(obj, bytes):
        return hashlib.sha256(obj).hexdigest()
    if depth > MAX_DEPTH:
        return ["deep", type(obj).__qualname__]
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else list(obj)
        return [type(obj).__name__, *[_describe(v, seen, depth + 1) for v in items[:MAX_ITEMS]], len(items)]
    if isinstance(obj, dict):
        if len(obj) > MAX_ITEMS * 64:  # a global table, not a setting: its size only
            return ["dict", len(obj)]
        keys = sorted(obj, key=repr)[:MAX_ITEMS]
        return ["dict", [[repr(k), _describe(obj[k], seen, depth + 1)] for k in keys], len(obj)]
    if isinstance(obj, types.ModuleType):
        return ["module", obj.__name__]
    if isinstance(obj, functools.partial):
        return ["partial", *(_describe(v, seen, depth + 1) for v in (obj.func, obj.args, obj.keywords))]
    if isinstance(obj, types.MethodType):
        return ["method", *(_describe(v, seen, depth + 1) for v in (obj.__func__, type(obj.__self__)))]
    if isinstance(obj, (types.FunctionType, type)):
        if _is_library(obj):
            return ["named", _name(obj)]
        if id(obj) in seen:  # recursion, or a helper reached twice
            return ["seen", _name(obj)]
        seen.add(id(obj))
        return (
            _function(obj, seen, depth) if isinstance(obj, types.FunctionType) else _class(obj, seen, depth)
        )
    if callable(obj) and isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return ["named", _name(obj)]
    return _instance(obj, seen, depth)


def _code(code: types.CodeType) -> tuple[Any, set[str]]:
    """A code object's bytecode, constants and the names it uses (nested code recursed)."""
    names = set(code.co_names)
    consts = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            inner, inner_names = _code(c)
            consts.append(inner)
            names |= inner_names
        else:
            consts.append(repr(c))
    return [code.co_code.hex(), consts, sorted(code.co_names)], names


def _function(fn: types.FunctionType, seen: set[int], depth: int) -> Any:
    body, names = _code(fn.__code__)
    cells = [_describe(cell_value(c), seen, depth + 1) for c in fn.__closure__ or ()]
    defaults = [_describe(v, seen, depth + 1) for v in (fn.__defaults__, fn.__kwdefaults__)]
    used = [[n, _describe(fn.__globals__[n], seen, depth + 1)] for n in sorted(names) if n in fn.__globals__]
    return ["function", _name(fn), body, cells, *defaults, used]


def cell_value(cell: Any) -> Any:
    """A closure cell's value (None while it is empty: a name the enclosing function assigns later)."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _class(cls: type, seen: set[int], depth: int) -> Any:
    source: str | list[list[Any]]
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined where no file holds it (exec, a notebook cell): its methods
        source = [
            [name, _describe(value, seen, depth + 1)]
            for name, value in sorted(vars(cls).items())
            if isinstance(value, (types.FunctionType, staticmethod, classmethod, property))
        ]
    return ["class", _name(cls), source, [_describe(b, seen, depth + 1) for b in cls.__bases__]]


def _instance(obj: Any, seen: set[int], depth: int) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.optim.Optimizer):
            return ["optimizer", _name(type(obj)), _describe(obj.defaults, seen, depth + 1)]
        if isinstance(obj, torch.nn.Module):
            shapes = [[n, list(t.shape)] for n, t in obj.state_dict().items()]
            return ["model", _describe(type(obj), seen, depth + 1), shapes]
        if isinstance(obj, torch.Tensor):
            return ["tensor", list(obj.shape), str(obj.dtype)]
    return ["object", _describe(type(obj), seen, depth + 1)]
