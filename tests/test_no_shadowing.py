"""No attribute hides a method of a base class, and no method hides a base's property.

The engines are assembled from mixins (the SQL base, channels, fair order, slot passing,
each database's packets), and a name given twice in one hierarchy is a trap: MariaDB's
``SlotPacket`` once cached its rendered statements in a property named ``_pass_heads``,
which hid :meth:`FairAcquire._pass_heads`, so every onward settle (a defer, a cancel, a
pipeline's outputs) of an ordered channel failed with "'dict' object is not callable" and
the channel stalled. Overriding a method with a method, or a value with a value, stays
allowed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from functools import cached_property
from types import FunctionType
from typing import Any

import sqlmq


def _modules() -> list[Any]:
    return [importlib.import_module(m.name)
            for m in pkgutil.walk_packages(sqlmq.__path__, "sqlmq.")
            if not m.name.endswith("__main__")]


def _kind(value: Any) -> str:
    if isinstance(value, FunctionType | staticmethod | classmethod):
        return "method"
    if isinstance(value, property | cached_property):
        return "property"
    return "value"


def _sqlmq_classes() -> list[type]:
    found: dict[str, type] = {}
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__.startswith("sqlmq."):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def shadowed(cls: type) -> list[str]:
    """Each name that ``cls`` or one of its bases defines as a method where a class later
    in the MRO defines it as something else, or the other way round."""
    out = []
    for i, owner in enumerate(cls.__mro__[:-1]):
        for name, value in vars(owner).items():
            if name.startswith("_") and name.endswith("_"):
                continue  # dunders, and the sunder names Enum writes on each enum
            base = next((b for b in cls.__mro__[i + 1:] if name in vars(b)), None)
            if base is None:
                continue
            mine, theirs = _kind(value), _kind(vars(base)[name])
            if mine != theirs and "method" in (mine, theirs):
                out.append(f"{owner.__qualname__}.{name} ({mine}) hides "
                           f"{base.__qualname__}.{name} ({theirs})")
    return out


def test_no_class_of_sqlmq_hides_a_method_of_its_bases() -> None:
    classes = _sqlmq_classes()
    assert len(classes) > 100  # the walk found the package
    found = sorted({s for cls in classes for s in shadowed(cls)})
    assert found == []


def test_the_check_finds_a_property_hiding_a_method() -> None:
    class Base:
        def _pass_heads(self) -> None: ...

    class Packet:
        @cached_property
        def _pass_heads(self) -> dict[int, str]:
            return {}

    class Engine(Packet, Base):
        pass

    assert shadowed(Engine) == [
        "test_the_check_finds_a_property_hiding_a_method.<locals>.Packet._pass_heads "
        "(property) hides test_the_check_finds_a_property_hiding_a_method.<locals>.Base."
        "_pass_heads (method)"]
