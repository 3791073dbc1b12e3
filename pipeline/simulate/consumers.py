"""Simulated consumer groups: membership, rebalance, consumption, commits and the admin poller.

Ownership always comes from :func:`pipeline.rocketmq.allocate.rebalance` over the registered
members, as every member's ``RebalanceImpl`` computes it. A crashed member stays registered until
the broker expires its channel (``session_timeout_s``), so its queues stall until then; a member
that leaves commits its offsets and unregisters at once. A new owner resumes from the committed
offset, or from its ``ConsumeFromWhere`` when nothing was committed. The admin poller reports each
queue's committed offset every ``progress_interval_s`` (``mqadmin consumerProgress``), except for
brokers it cannot reach; membership is reported on each change and every ``membership_interval_s``.

Rows are positional, in :class:`schemas.events.ConsumerProgress` / ``GroupMembership`` field order.
"""

from __future__ import annotations

from typing import Any

from pipeline.rocketmq.allocate import canonical_strategy_name, owners, rebalance
from pipeline.rocketmq.queues import MessageQueue
from pipeline.simulate.brokers import BrokerModel
from pipeline.simulate.queues import QueueLog
from pipeline.simulate.scenario import ConsumerEventSpec, ConsumerGroupSpec


class Member:
    __slots__ = ("alive", "cid", "expires_ms", "index", "rate", "registered")

    def __init__(self, cid: str, index: int, rate: float) -> None:
        self.cid = cid
        self.index = index
        self.alive = True
        self.registered = True
        self.rate = rate
        self.expires_ms: int | None = None


class GroupSim:
    """One consumer group on one topic of one cluster."""

    def __init__(
        self,
        spec: ConsumerGroupSpec,
        group_index: int,
        cluster: str,
        logs: list[QueueLog],
        model: BrokerModel,
        events: list[ConsumerEventSpec],
        epoch_ms: int,
    ) -> None:
        self.spec = spec
        self.group_index = group_index
        self.cluster = cluster
        self.model = model
        self.strategy = canonical_strategy_name(spec.strategy)
        self.logs = {log.mq: log for log in logs}
        self.members: list[Member] = []
        for _ in range(spec.instances):
            self._new_member(spec.rate_per_s)
        self.schedule = sorted(
            ((epoch_ms + round(e.at_s * 1000), i, e) for i, e in enumerate(events)), key=lambda x: (x[0], x[1])
        )
        self.owner: dict[MessageQueue, str] = {}
        self.position: dict[MessageQueue, float] = {}
        self.committed: dict[MessageQueue, int] = {mq: -1 for mq in self.logs}
        self.epoch_ms = epoch_ms
        self.rebalance_at: int | None = epoch_ms
        # Offsets are persisted half a period out of phase with the poller, so a healthy group
        # shows the small committed-offset lag a real one does rather than exactly zero.
        self.next_commit = epoch_ms + round(spec.commit_interval_s * 500)
        self.next_progress = epoch_ms + round(spec.progress_interval_s * 1000)
        self.next_membership = epoch_ms
        self.ownership_log: list[tuple[int, dict[MessageQueue, str]]] = []

    # -- membership ---------------------------------------------------------------------------

    def _new_member(self, rate: float) -> Member:
        i = len(self.members)
        cid = f"10.20.{self.group_index}.{i + 1}@{4000 + i}"
        member = Member(cid, i, rate)
        self.members.append(member)
        return member

    def registered_cids(self) -> list[str]:
        return [m.cid for m in self.members if m.registered]

    def _targets(self, e: ConsumerEventSpec) -> list[Member]:
        if e.instances is not None:
            return [self.members[i] for i in e.instances if i < len(self.members) and self.members[i].alive]
        alive = [m for m in self.members if m.alive]
        return alive[-e.count :] if e.count <= len(alive) else alive

    def _apply(self, at: int, e: ConsumerEventSpec) -> bool:
        """Apply one scheduled change; True when the registered set changed."""
        if e.kind == "join":
            rate = self.spec.rate_per_s
            for _ in range(e.count):
                self._new_member(rate)
            return True
        targets = self._targets(e)
        if e.kind == "rate":
            for m in targets if e.instances is not None else [m for m in self.members if m.alive]:
                m.rate = float(e.rate_per_s or 0.0)
            return False
        for m in targets:
            if e.kind == "leave":
                self._commit_member(m.cid, at)
                m.registered = False
            else:  # crash: nothing is committed; the broker notices after the session timeout
                m.expires_ms = at + round(self.spec.session_timeout_s * 1000)
            m.alive = False
        return e.kind == "leave" and bool(targets)

    def _membership_row(self, ts: int) -> list[Any]:
        cids = tuple(sorted(self.registered_cids()))
        return [ts, self.cluster, self.spec.group, self.spec.topic, cids, self.strategy]

    # -- rebalance and consumption ------------------------------------------------------------

    def _rebalance(self, at: int) -> None:
        cids = self.registered_cids()
        new_owner = owners(rebalance(self.strategy, self.spec.group, list(self.logs), cids)) if cids else {}
        alive = {m.cid for m in self.members if m.alive}
        for mq, log in self.logs.items():
            old, new = self.owner.get(mq), new_owner.get(mq)
            if old == new:
                continue
            if old is not None and old in alive and mq in self.position and not self.model.is_down(mq.broker, at):
                self.committed[mq] = int(self.position[mq])  # persisted when the queue is dropped
            self.position.pop(mq, None)
            if new is not None:
                self.position[mq] = float(self._start_offset(mq, log))
        self.owner = new_owner
        self.ownership_log.append((at, dict(new_owner)))

    def _start_offset(self, mq: MessageQueue, log: QueueLog) -> int:
        committed = self.committed[mq]
        if committed >= 0:
            return committed
        where = self.spec.consume_from_where
        if where == "CONSUME_FROM_FIRST_OFFSET":
            return 0
        if where == "CONSUME_FROM_TIMESTAMP":
            return log.first_offset_at(self.epoch_ms + round(self.spec.consume_timestamp_s * 1000))
        return log.count

    def _consume(self, start: int, end: int) -> None:
        dt_s = (end - start) / 1000.0
        owned: dict[str, list[MessageQueue]] = {}
        for mq, cid in self.owner.items():
            owned.setdefault(cid, []).append(mq)
        for m in self.members:
            if not m.alive or m.cid not in owned:
                continue
            queues = [mq for mq in owned[m.cid] if not self.model.is_down(mq.broker, start)]
            capacity = m.rate * dt_s
            backlog = sorted(((self.logs[mq].count - self.position[mq], mq.queue_id, mq) for mq in queues),
                             key=lambda x: (x[0], x[2].broker, x[1]))
            for k, (todo, _, mq) in enumerate(backlog):
                take = min(max(todo, 0.0), capacity / (len(backlog) - k))
                self.position[mq] += take
                capacity -= take

    def _commit_member(self, cid: str, at: int) -> None:
        for mq, owner in self.owner.items():
            if owner == cid and mq in self.position and not self.model.is_down(mq.broker, at):
                self.committed[mq] = int(self.position[mq])

    def _commit_all(self, at: int) -> None:
        for m in self.members:
            if m.alive:
                self._commit_member(m.cid, at)

    def _progress_rows(self, ts: int) -> list[list[Any]]:
        rows = []
        for mq, log in self.logs.items():
            if self.model.is_down(mq.broker, ts):
                continue  # the poller gets no answer from a broker that is down
            committed = self.committed[mq]
            last = log.store_time(committed - 1) if committed > 0 else None
            rows.append([ts, self.cluster, self.spec.group, mq.topic, mq.broker, mq.queue_id, committed,
                         log.count, self.owner.get(mq), last])
        return rows

    def step(self, start: int, end: int, progress: list[list[Any]], membership: list[list[Any]]) -> None:
        """Advance the group over ``[start, end)``; progress is observed at ``end``."""
        changed_at: int | None = None
        while self.schedule and self.schedule[0][0] < end:
            at, _, event = self.schedule.pop(0)
            if self._apply(max(at, start), event):
                membership.append(self._membership_row(max(at, start)))
                changed_at = max(at, start)
        for m in self.members:
            if m.expires_ms is not None and m.registered and m.expires_ms < end:
                m.registered = False
                membership.append(self._membership_row(max(m.expires_ms, start)))
                changed_at = max(m.expires_ms, start)
        if changed_at is not None:
            due = changed_at + round(self.spec.rebalance_delay_s * 1000)
            self.rebalance_at = due if self.rebalance_at is None else min(self.rebalance_at, due)
        if self.rebalance_at is not None and self.rebalance_at < end:
            self._rebalance(max(self.rebalance_at, start))
            self.rebalance_at = None
        self._consume(start, end)
        if self.next_commit <= end:
            self._commit_all(end)
            self.next_commit += round(self.spec.commit_interval_s * 1000)
        if self.next_membership <= end:
            membership.append(self._membership_row(self.next_membership))
            self.next_membership += round(self.spec.membership_interval_s * 1000)
        if self.next_progress <= end:
            progress.extend(self._progress_rows(end))
            self.next_progress += round(self.spec.progress_interval_s * 1000)

    def min_needed_offset(self, log: QueueLog) -> int:
        """The lowest offset whose store time this group may still ask for."""
        committed = self.committed[log.mq]
        return max(0, committed - 1) if committed >= 0 else 0
