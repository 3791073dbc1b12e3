"""Build frozen dataclasses from parsed TOML, checking every key and value on the way.

One loader for the config file and the simulator's scenarios: unknown keys, missing keys and wrong
values fail with a message that names the key (``stream.trigger_interval_s: expected a number``),
so a typo never silently falls back to a default.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal


def build(
    cls: type,
    raw: Any,
    prefix: str,
    error: type[Exception],
    converters: Mapping[type, Callable[[Any, str], Any]] | None = None,
) -> Any:
    """An instance of dataclass ``cls`` from mapping ``raw``; keys are reported as ``prefix + name``.

    ``converters`` handle special leaf types (e.g. a secret wrapper). After construction, a
    ``validate()`` method of the instance, if any, runs; a ``ValueError`` it raises is re-raised as
    ``error`` with the prefix.
    """
    if not isinstance(raw, Mapping):
        raise error(f"{prefix.rstrip('.') or 'config'}: expected a table, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise error(f"unknown key {prefix}{unknown[0]}; valid keys here: {sorted(fields)}")
    missing = [
        name
        for name, f in fields.items()
        if name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise error(f"missing key {prefix}{missing[0]}")
    hints = typing.get_type_hints(cls)
    values = {name: convert(hints[name], raw[name], f"{prefix}{name}", error, converters) for name in raw}
    obj = cls(**values)
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except error:
            raise
        except ValueError as exc:
            raise error(f"{prefix}{exc}") from None
    return obj


def convert(
    tp: Any,
    value: Any,
    key: str,
    error: type[Exception],
    converters: Mapping[type, Callable[[Any, str], Any]] | None = None,
) -> Any:
    """``value`` checked (and converted) as type ``tp``; ``key`` names it in errors."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if converters and tp in converters:
        return converters[tp](value, key)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:  # pragma: no cover - our dataclasses only use Optional unions
            raise error(f"{key}: unsupported union type")
        return convert(inner[0], value, key, error, converters)
    if origin is Literal:
        if value not in args:
            raise error(f"{key}: {value!r} is not valid; valid values: {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise error(f"{key}: expected a list, got {type(value).__name__}")
        return tuple(convert(args[0], v, f"{key}[{i}]", error, converters) for i, v in enumerate(value))
    if origin in (collections.abc.Mapping, dict) or tp in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise error(f"{key}: expected a table, got {type(value).__name__}")
        vtype = args[1] if len(args) == 2 else Any
        if vtype is str:  # settings tables such as spark.conf: Spark takes every value as a string
            return types.MappingProxyType({str(k): _setting(v, f"{key}.{k}", error) for k, v in value.items()})
        return types.MappingProxyType(
            {str(k): convert(vtype, v, f"{key}.{k}", error, converters) for k, v in value.items()}
        )
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key + ".", error, converters)  # type: ignore[arg-type]
    return _scalar(tp, value, key, error)


def _scalar(tp: Any, value: Any, key: str, error: type[Exception]) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):  # from the environment
            return value.lower() == "true"
        raise error(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise error(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise error(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str) and value:
            return value
        raise error(f"{key}: expected a non-empty string, got {value!r}")
    raise error(f"{key}: unsupported type {tp!r}")  # pragma: no cover


def _setting(value: Any, key: str, error: type[Exception]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise error(f"{key}: expected a string, number or boolean, got {value!r}")
