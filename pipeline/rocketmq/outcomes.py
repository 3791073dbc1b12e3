"""From a send result to the arguments of ``updateFaultItem`` (RocketMQ's ``MQFaultStrategy``).

``DefaultMQProducerImpl.sendDefaultImpl`` calls ``updateFaultItem`` from a different ``catch`` per
exception class, each with its own (isolation, reachable). Events only carry the class name (or a
broker response text), so this module names the class first, then applies the generation's table.
"""

from __future__ import annotations

import enum
import re

from pipeline.rocketmq.generation import GEN_5, GEN_49, generation_for_client_version

SUCCESS_STATUSES = frozenset({"SEND_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})
FAILED = "FAILED"
SEND_STATUSES = SUCCESS_STATUSES | {FAILED}


class ErrorKind(str, enum.Enum):
    """The ``catch`` block of ``sendDefaultImpl`` an exception lands in."""

    REMOTING = "RemotingException"
    CLIENT = "MQClientException"
    BROKER = "MQBrokerException"
    INTERRUPTED = "InterruptedException"
    UNKNOWN = "unknown"


_CLASS_KINDS = {
    "RemotingException": ErrorKind.REMOTING,
    "RemotingConnectException": ErrorKind.REMOTING,
    "RemotingTimeoutException": ErrorKind.REMOTING,
    "RemotingSendRequestException": ErrorKind.REMOTING,
    "RemotingTooMuchRequestException": ErrorKind.REMOTING,
    "RemotingCommandException": ErrorKind.REMOTING,
    "MQClientException": ErrorKind.CLIENT,
    "MQBrokerException": ErrorKind.BROKER,
    "InterruptedException": ErrorKind.INTERRUPTED,
}

# A Java class name, optionally qualified, optionally followed by ": message".
_CLASS_RE = re.compile(r"^\s*((?:[A-Za-z_$][\w$]*\.)*([A-Za-z_$][\w$]*))\s*(?::|$)")
# Broker responses such as "[TIMEOUT_CLEAN_QUEUE]broker busy" or "CODE: 2  DESC: [PCBUSY_CLEAN_QUEUE]...".
_BROKER_TAG_RE = re.compile(r"\[[A-Z][A-Z_]*\]|\bCODE:\s*-?\d+")
_CODE_RE = re.compile(r"\bCODE:\s*(-?\d+)")


def classify_error(error: str | None) -> ErrorKind:
    """Name the exception class of ``error`` (short or qualified name, or a broker response text)."""
    if not error:
        return ErrorKind.UNKNOWN
    match = _CLASS_RE.match(error)
    if match is not None and match[2] in _CLASS_KINDS:
        return _CLASS_KINDS[match[2]]
    if _BROKER_TAG_RE.search(error):
        return ErrorKind.BROKER
    return ErrorKind.UNKNOWN


def broker_response_code(error: str | None) -> int | None:
    """The response code in an ``MQBrokerException`` message ("CODE: 2 DESC: ..."), if present."""
    match = _CODE_RE.search(error or "")
    return int(match[1]) if match else None


# (isolation 4.9, isolation 5, reachable 5 with detector off, reachable 5 with detector on)
_TABLE: dict[ErrorKind, tuple[bool, bool, bool, bool]] = {
    ErrorKind.REMOTING: (True, True, True, False),
    ErrorKind.CLIENT: (True, False, True, True),
    ErrorKind.BROKER: (True, True, False, False),
    ErrorKind.INTERRUPTED: (False, False, True, True),
    # Not in the Java table: see update_args.
    ErrorKind.UNKNOWN: (False, False, True, True),
}


def update_args(
    status: str,
    error: str | None,
    client_version: str,
    detector_enabled: bool = False,
    isolation: bool | None = None,
    reachable: bool | None = None,
) -> tuple[bool, bool]:
    """(isolation, reachable) that the client passes to ``updateFaultItem`` for this send result.

    ``isolation`` / ``reachable``, when given (an event that recorded them), win over the table.
    4.9 has no reachable flag and reports True. A FAILED result whose error class is unknown (or
    missing) maps to (False, True), a plain latency-based update: exceptions outside the four
    ``catch`` blocks (RuntimeExceptions) leave ``sendDefaultImpl`` without any isolation, so
    inventing a 10-minute isolation would fabricate an avoidance window, while the latency update
    still flags a slow attempt. Use :func:`classify_error` to quarantine such events instead.
    An unknown status or an unparseable client version raises ValueError.
    """
    return update_args_for(
        generation_for_client_version(client_version), status, error, detector_enabled, isolation, reachable
    )


def update_args_for(
    generation: str,
    status: str,
    error: str | None,
    detector_enabled: bool = False,
    isolation: bool | None = None,
    reachable: bool | None = None,
) -> tuple[bool, bool]:
    """:func:`update_args` for a generation name ("4.9" or "5") instead of a client version."""
    normalized = status.strip().upper() if isinstance(status, str) else status
    if normalized not in SEND_STATUSES:
        raise ValueError(f"unknown send status {status!r}; valid: {sorted(SEND_STATUSES)}")
    if generation not in (GEN_49, GEN_5):
        raise ValueError(f"unknown fault generation {generation!r}; valid: {[GEN_49, GEN_5]}")
    if normalized in SUCCESS_STATUSES:
        computed = (False, True)
    else:
        iso_49, iso_5, reach_off, reach_on = _TABLE[classify_error(error)]
        if generation == GEN_49:
            computed = (iso_49, True)
        else:
            computed = (iso_5, reach_on if detector_enabled else reach_off)
    return (
        computed[0] if isolation is None else bool(isolation),
        computed[1] if reachable is None else bool(reachable),
    )
