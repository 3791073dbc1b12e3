"""The few Java library semantics the allocation strategies depend on, where Python differs.

RocketMQ's results hinge on them: ``String.split`` drops trailing empty strings (so ``"idc1@b@"`` is
a valid ``idc@broker`` name), ``String.compareTo`` orders UTF-16 code units (not code points), and
failures are exception classes that RebalanceImpl catches and logs.
"""

from __future__ import annotations

from schemas.errors import FaultwatchError


class JavaException(FaultwatchError):
    """An exception the Java code would throw; ``java_name`` is its class, as the vectors spell it."""

    java_name = "java.lang.Exception"


class IllegalArgumentException(JavaException):
    java_name = "java.lang.IllegalArgumentException"


class NullPointerException(JavaException):
    java_name = "java.lang.NullPointerException"


def java_split(text: str, separator: str) -> list[str]:
    """``text.split(separator)`` for a literal separator, with Java's limit-0 rules.

    Trailing empty strings are removed (``"@"`` -> ``[]``, ``"a@"`` -> ``["a"]``), a leading one is
    kept (``"@x"`` -> ``["", "x"]``), and a string without the separator is returned whole, even
    when empty (``""`` -> ``[""]``).
    """
    if separator not in text:
        return [text]
    parts = text.split(separator)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def java_str_key(text: str) -> bytes:
    """A sort key giving ``String.compareTo`` order: UTF-16 code units, compared as unsigned.

    Big-endian UTF-16 bytes compare exactly like the code units, which differs from Python's code
    point order only for characters above U+FFFF against U+E000..U+FFFF.
    """
    return text.encode("utf-16-be", "surrogatepass")


def java_sorted(texts: list[str]) -> list[str]:
    """``Collections.sort`` of strings (stable, String order); ASCII-only lists skip the encoding."""
    if all(t.isascii() for t in texts):
        return sorted(texts)
    return sorted(texts, key=java_str_key)
