"""Ports of RocketMQ's ``AllocateMessageQueueStrategy`` implementations, line for line.

Each ``allocate`` takes the lists exactly as given (the strategies do not sort; RebalanceImpl does)
and raises :mod:`pipeline.rocketmq.javalang` exceptions where the Java code throws, so the public
``allocate`` can report the same failures as error values.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from pipeline.rocketmq.javalang import (
    IllegalArgumentException,
    NullPointerException,
    java_split,
    java_str_key,
)
from pipeline.rocketmq.queues import MessageQueue

Queues = Sequence[MessageQueue]
Cids = Sequence[str]
Allocation = list[MessageQueue] | None


class Strategy(Protocol):
    name: str

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue] | None: ...


def check(current_cid: str | None, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]) -> bool:
    """``AbstractAllocateMessageQueueStrategy.check``: throws on empty input, False if not a member."""
    if not current_cid:
        raise IllegalArgumentException("currentCID is empty")
    if not mq_all:
        raise IllegalArgumentException("mqAll is null or mqAll empty")
    if not cid_all:
        raise IllegalArgumentException("cidAll is null or cidAll empty")
    return current_cid in cid_all


class Averagely:
    """Contiguous blocks; the first ``|mq| % |cid|`` consumers get one extra queue."""

    name = "AVG"

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Queues, cid_all: Cids) -> Allocation:
        if not check(current_cid, mq_all, cid_all):
            return []
        index = cid_all.index(current_cid)
        n_mq, n_cid = len(mq_all), len(cid_all)
        mod = n_mq % n_cid
        if n_mq <= n_cid:
            average = 1
        elif mod > 0 and index < mod:
            average = n_mq // n_cid + 1
        else:
            average = n_mq // n_cid
        start = index * average if mod > 0 and index < mod else index * average + mod
        count = min(average, n_mq - start)
        return [mq_all[(start + i) % n_mq] for i in range(count)]


class AveragelyByCircle:
    """Queue ``i`` goes to consumer ``i % |cid|``."""

    name = "AVG_BY_CIRCLE"

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Queues, cid_all: Cids) -> Allocation:
        if not check(current_cid, mq_all, cid_all):
            return []
        index = cid_all.index(current_cid)
        n_cid = len(cid_all)
        return [mq_all[i] for i in range(index, len(mq_all)) if i % n_cid == index]


@functools.lru_cache(maxsize=1 << 16)
def md5_hash(key: str) -> int:
    """``MD5Hash.hash``: the first four digest bytes, big-endian, as an unsigned 32-bit value."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


class ConsistentHashRing:
    """``ConsistentHashRouter`` with MD5: a TreeMap from hash to client id."""

    def __init__(self, cids: Sequence[str], virtual_node_cnt: int) -> None:
        ring: dict[int, str] = {}
        replicas: dict[str, int] = {}
        for cid in cids:
            existing = replicas.get(cid, 0)  # getExistingReplicas: this cid's entries now in the ring
            for i in range(virtual_node_cnt):
                point = md5_hash(f"{cid}-{i + existing}")
                old = ring.get(point)
                if old is not None:  # TreeMap.put: the later key wins the point
                    replicas[old] -= 1
                ring[point] = cid
                replicas[cid] = replicas.get(cid, 0) + 1
        self._points = sorted(ring)
        self._owners = [ring[p] for p in self._points]

    def route(self, key: str) -> str | None:
        """The first ring point at or after the key's hash, wrapping to the smallest."""
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, md5_hash(key))
        return self._owners[i if i < len(self._points) else 0]


class ConsistentHash:
    """MD5 ring with ``virtual_node_cnt`` virtual nodes per client id (keys ``cid-i``)."""

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_cnt: int = 10) -> None:
        if virtual_node_cnt < 0:
            raise IllegalArgumentException(f"illegal virtualNodeCnt :{virtual_node_cnt}")
        self.virtual_node_cnt = virtual_node_cnt
        self._routes_for: tuple[tuple[str, ...], tuple[MessageQueue, ...], list[str | None]] | None = None

    def _routes(self, mq_all: Queues, cid_all: Cids) -> list[str | None]:
        """Each queue's owner; a rebalance asks once per member with the same lists, so keep the last."""
        cids, mqs = tuple(cid_all), tuple(mq_all)
        cached = self._routes_for
        if cached is None or cached[0] != cids or cached[1] != mqs:
            ring = ConsistentHashRing(cids, self.virtual_node_cnt)
            cached = self._routes_for = (cids, mqs, [ring.route(str(mq)) for mq in mqs])
        return cached[2]

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Queues, cid_all: Cids) -> Allocation:
        if not check(current_cid, mq_all, cid_all):
            return []
        routes = self._routes(mq_all, cid_all)
        return [mq for mq, owner in zip(mq_all, routes, strict=True) if owner == current_cid]


class ByConfig:
    """A fixed list for every consumer; never checks anything (``None`` when not configured)."""

    name = "CONFIG"

    def __init__(self, config_mq_list: Sequence[MessageQueue] | None = None) -> None:
        self.config_mq_list = None if config_mq_list is None else list(config_mq_list)

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Queues, cid_all: Cids) -> Allocation:
        return None if self.config_mq_list is None else list(self.config_mq_list)


class ByMachineRoom:
    """Only queues of brokers named ``idc@broker`` with ``idc`` in ``consumer_idcs``, shared evenly."""

    name = "MACHINE_ROOM"

    def __init__(self, consumer_idcs: Collection[str] | None = None) -> None:
        self.consumer_idcs = None if consumer_idcs is None else frozenset(consumer_idcs)

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Queues, cid_all: Cids) -> Allocation:
        if not check(current_cid, mq_all, cid_all):
            return []
        current = cid_all.index(current_cid)
        eligible = []
        for mq in mq_all:
            parts = java_split(mq.broker, "@")
            if len(parts) == 2:
                if self.consumer_idcs is None:
                    raise NullPointerException("consumeridcs is null")
                if parts[0] in self.consumer_idcs:
                    eligible.append(mq)
        n_cid = len(cid_all)
        mod, rem = len(eligible) // n_cid, len(eligible) % n_cid
        result = eligible[mod * current : mod * current + mod]
        if rem > current:
            result.append(eligible[current + mod * n_cid])
        return result


class MachineRoomNearby:
    """Queues go to consumers in the broker's room; rooms without consumers are shared by all."""

    name = "MACHINE_ROOM_NEARBY"

    def __init__(
        self,
        inner: Strategy | None,
        broker_rooms: Mapping[str, str | None] | None = None,
        consumer_rooms: Mapping[str, str | None] | None = None,
    ) -> None:
        if inner is None:
            raise NullPointerException("allocateMessageQueueStrategy is null")
        self.inner = inner
        self.broker_rooms = dict(broker_rooms or {})
        self.consumer_rooms = dict(consumer_rooms or {})

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Queues, cid_all: Cids) -> Allocation:
        if not check(current_cid, mq_all, cid_all):
            return []
        mq_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mq_all:
            room = self.broker_rooms.get(mq.broker)
            if not room:
                raise IllegalArgumentException(f"Machine room is null for mq {mq}")
            mq_by_room.setdefault(room, []).append(mq)
        cid_by_room: dict[str, list[str]] = {}
        for cid in cid_all:
            room = self.consumer_rooms.get(cid)
            if not room:
                raise IllegalArgumentException(f"Machine room is null for consumer id {cid}")
            cid_by_room.setdefault(room, []).append(cid)
        result: list[MessageQueue] = []
        current_room = self.consumer_rooms.get(current_cid)
        local = mq_by_room.pop(current_room, None) if current_room is not None else None
        if local and current_room is not None:
            result.extend(
                _non_null(self.inner.allocate(consumer_group, current_cid, local, cid_by_room[current_room]))
            )
        for room in sorted(mq_by_room, key=java_str_key):  # a TreeMap iterates in String order
            if room not in cid_by_room:
                result.extend(
                    _non_null(self.inner.allocate(consumer_group, current_cid, mq_by_room[room], cid_all))
                )
        return result


def _non_null(queues: list[MessageQueue] | None) -> list[MessageQueue]:
    """``List.addAll(null)`` throws; only an inner ByConfig without a list can return null."""
    if queues is None:
        raise NullPointerException("inner strategy returned null")
    return queues
