"""Queue allocation: registry, Java semantics, failures as values, and ownership properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.rocketmq import STRATEGIES, AllocResult, MessageQueue, allocate, owners, rebalance
from pipeline.rocketmq.allocate import canonical_strategy_name, owner_lists
from pipeline.rocketmq.javalang import java_sorted, java_split
from pipeline.rocketmq.strategies import md5_hash

IAE, NPE = "java.lang.IllegalArgumentException", "java.lang.NullPointerException"


def Q(broker: str, qid: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, broker, qid)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("idc1@b@", ["idc1", "b"]),
        ("@", []),
        ("@x", ["", "x"]),
        ("", [""]),
        ("a@@b", ["a", "", "b"]),
        ("@@", []),
        ("x", ["x"]),
    ],
)
def test_java_split(text: str, parts: list[str]) -> None:
    assert java_split(text, "@") == parts


def test_java_string_order() -> None:
    assert java_sorted(["10.0.0.3@1", "10.0.0.12@1", "a", "Z"]) == ["10.0.0.12@1", "10.0.0.3@1", "Z", "a"]
    # UTF-16 code units: a supplementary character (surrogates D800..) sorts before U+FFFD
    assert java_sorted(["\ufffd", "\U0001f600"]) == ["\U0001f600", "\ufffd"]


def test_message_queue_string_and_order() -> None:
    assert str(Q("broker-a", 3)) == "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"
    assert sorted([Q("b", 10), Q("b", 9), Q("a", 100), Q("a", 2, "S")]) == [
        Q("a", 2, "S"),
        Q("a", 100),
        Q("b", 9),
        Q("b", 10),
    ]


def test_md5_ring_hash_reads_four_bytes_big_endian() -> None:
    # md5("a") = 0cc175b9...
    assert md5_hash("a") == 0x0CC175B9


def test_registry_accepts_both_names_and_refuses_unknown() -> None:
    assert canonical_strategy_name("AllocateMessageQueueAveragely") == "AVG"
    assert canonical_strategy_name("AllocateMachineRoomNearby") == "MACHINE_ROOM_NEARBY"
    assert {spec.name for spec in STRATEGIES.values()} == {
        "AVG",
        "AVG_BY_CIRCLE",
        "CONSISTENT_HASH",
        "CONFIG",
        "MACHINE_ROOM",
        "MACHINE_ROOM_NEARBY",
    }
    with pytest.raises(ValueError, match="AVG_BY_CIRCLE"):
        allocate("ROUND_ROBIN", "g", "c1", [Q("a", 0)], ["c1"])
    with pytest.raises(ValueError, match="virtual_node_cnt"):
        allocate("AVG", "g", "c1", [Q("a", 0)], ["c1"], virtual_node_cnt=3)


MQS = [Q("a", i) for i in range(5)]
# (strategy, current, mq_all, cid_all, options) -> AllocResult
ALLOCATE_TABLE = [
    ("AVG first gets the extra", "AVG", "c1", MQS, ["c1", "c2"], {}, AllocResult(MQS[:3])),
    ("AVG second", "AVG", "c2", MQS, ["c1", "c2"], {}, AllocResult(MQS[3:])),
    ("AVG idle consumer", "AVG", "c3", MQS[:2], ["c1", "c2", "c3"], {}, AllocResult([])),
    ("AVG not a member", "AVG", "x", MQS, ["c1"], {}, AllocResult([])),
    ("AVG_BY_CIRCLE", "AVG_BY_CIRCLE", "c2", MQS, ["c1", "c2"], {}, AllocResult([MQS[1], MQS[3]])),
    ("empty current cid", "AVG", "", MQS, ["c1"], {}, AllocResult(None, IAE)),
    ("empty mq_all", "AVG_BY_CIRCLE", "c1", [], ["c1"], {}, AllocResult(None, IAE)),
    ("empty cid_all", "CONSISTENT_HASH", "c1", MQS, [], {}, AllocResult(None, IAE)),
    (
        "negative virtual nodes",
        "CONSISTENT_HASH",
        "c1",
        MQS,
        ["c1"],
        {"virtual_node_cnt": -1},
        AllocResult(None, IAE),
    ),
    (
        "zero virtual nodes: nobody",
        "CONSISTENT_HASH",
        "c1",
        MQS,
        ["c1"],
        {"virtual_node_cnt": 0},
        AllocResult([]),
    ),
    ("one consumer owns the ring", "CONSISTENT_HASH", "c1", MQS, ["c1"], {}, AllocResult(MQS)),
    ("CONFIG never checks", "CONFIG", "", [], [], {"config_mq_list": [Q("z", 1)]}, AllocResult([Q("z", 1)])),
    ("CONFIG unset is null", "CONFIG", "c1", MQS, ["c1"], {}, AllocResult(None)),
    (
        "MACHINE_ROOM idc filter",
        "MACHINE_ROOM",
        "c1",
        [Q("idc1@a", 0), Q("idc2@b", 0), Q("idc1@b@", 1), Q("@", 2)],
        ["c1"],
        {"consumer_idcs": ["idc1"]},
        AllocResult([Q("idc1@a", 0), Q("idc1@b@", 1)]),
    ),
    (
        "MACHINE_ROOM null idcs with idc names",
        "MACHINE_ROOM",
        "c1",
        [Q("idc1@a", 0)],
        ["c1"],
        {},
        AllocResult(None, NPE),
    ),
    ("MACHINE_ROOM null idcs, plain names", "MACHINE_ROOM", "c1", [Q("a", 0)], ["c1"], {}, AllocResult([])),
    (
        "NEARBY local room first, roomless rooms shared",
        "MACHINE_ROOM_NEARBY",
        "hz1",
        [Q("hz-a", 0), Q("hz-a", 1), Q("bj-b", 0)],
        ["hz1", "sh1"],
        {
            "inner_strategy": "AVG",
            "broker_rooms": {"hz-a": "hz", "bj-b": "bj"},
            "consumer_rooms": {"hz1": "hz", "sh1": "sh"},
        },
        AllocResult([Q("hz-a", 0), Q("hz-a", 1), Q("bj-b", 0)]),
    ),
    (
        "NEARBY missing room",
        "MACHINE_ROOM_NEARBY",
        "c1",
        [Q("a", 0)],
        ["c1"],
        {"inner_strategy": "AVG", "broker_rooms": {}, "consumer_rooms": {"c1": "hz"}},
        AllocResult(None, IAE),
    ),
    (
        "NEARBY empty room",
        "MACHINE_ROOM_NEARBY",
        "c1",
        [Q("a", 0)],
        ["c1"],
        {"inner_strategy": "AVG", "broker_rooms": {"a": "hz"}, "consumer_rooms": {"c1": ""}},
        AllocResult(None, IAE),
    ),
    ("NEARBY without inner", "MACHINE_ROOM_NEARBY", "c1", [Q("a", 0)], ["c1"], {}, AllocResult(None, NPE)),
]


@pytest.mark.parametrize(
    ("strategy", "current", "mq_all", "cid_all", "options", "expected"),
    [r[1:] for r in ALLOCATE_TABLE],
    ids=[r[0] for r in ALLOCATE_TABLE],
)
def test_allocate(
    strategy: str, current: str, mq_all: list, cid_all: list, options: dict, expected: AllocResult
) -> None:
    assert allocate(strategy, "CG", current, mq_all, cid_all, **options) == expected


def test_rebalance_sorts_dedups_and_owns() -> None:
    rb = rebalance(
        "AVG", "CG", [Q("b", 1), Q("a", 10), Q("a", 9), Q("b", 1)], ["c2", "c1", "c2"], current_cid="c1"
    )
    assert rb.mq_all_sorted == [Q("a", 9), Q("a", 10), Q("b", 1)]
    assert rb.cid_all_sorted == ["c1", "c2", "c2"]  # Java keeps duplicate ids
    assert rb.ownership_by_cid == {"c1": AllocResult([Q("a", 9)]), "c2": AllocResult([Q("a", 10)])}
    assert rb.current == AllocResult([Q("a", 9)])
    assert owners(rb) == {Q("a", 9): "c1", Q("a", 10): "c2"}  # the duplicate id leaves b-1 unowned


def test_byconfig_is_claimed_by_everyone() -> None:
    rb = rebalance("CONFIG", "CG", [Q("a", 0)], ["c2", "c1"], config_mq_list=[Q("a", 0)])
    assert owner_lists(rb) == {Q("a", 0): ["c1", "c2"]}
    assert owners(rb) == {Q("a", 0): "c1"}


def test_constructor_failure_fails_every_member() -> None:
    rb = rebalance("CONSISTENT_HASH", "CG", [Q("a", 0)], ["c1", "c2"], virtual_node_cnt=-3, current_cid="c1")
    assert set(rb.ownership_by_cid.values()) == {AllocResult(None, IAE)} and rb.current == AllocResult(
        None, IAE
    )


NAMES = st.text(alphabet="abcXYZ019.-", min_size=1, max_size=6)
GROUPS = st.fixed_dictionaries(
    {
        "queues": st.sets(
            st.tuples(st.sampled_from(["T", "U"]), st.sampled_from(["b1", "b2", "b3"]), st.integers(0, 40)),
            min_size=1,
            max_size=40,
        ),
        "cids": st.lists(NAMES, min_size=1, max_size=12, unique=True),
        "strategy": st.sampled_from(
            ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY"]
        ),
        "inner": st.sampled_from(["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]),
        "rooms": st.lists(st.sampled_from(["hz", "sh", "bj"]), min_size=15, max_size=15),
    }
)


def _options(group: dict) -> tuple[list[MessageQueue], dict]:
    strategy, rooms = group["strategy"], group["rooms"]
    if strategy == "MACHINE_ROOM":  # every broker in a consumer idc, so every queue is eligible
        mqs = [MessageQueue(t, f"{rooms[int(b[1])]}@{b}", q) for t, b, q in group["queues"]]
        return mqs, {"consumer_idcs": ["hz", "sh", "bj"]}
    mqs = [MessageQueue(t, b, q) for t, b, q in group["queues"]]
    if strategy == "MACHINE_ROOM_NEARBY":
        return mqs, {
            "inner_strategy": group["inner"],
            "broker_rooms": {f"b{i}": rooms[i] for i in range(1, 4)},
            "consumer_rooms": {cid: rooms[4 + i % 11] for i, cid in enumerate(group["cids"])},
        }
    return mqs, {}


@settings(max_examples=300, deadline=None)
@given(group=GROUPS)
def test_every_queue_has_exactly_one_owner(group: dict) -> None:
    mqs, options = _options(group)
    rb = rebalance(group["strategy"], "CG", mqs, group["cids"], **options)
    assert all(r.error is None for r in rb.ownership_by_cid.values())
    claims = owner_lists(rb)
    assert set(claims) == set(mqs)
    assert all(len(cids) == 1 for cids in claims.values())


@settings(max_examples=200, deadline=None)
@given(
    n_queues=st.integers(1, 20),
    extra=st.integers(1, 10),
    cids=st.lists(NAMES, min_size=31, max_size=31, unique=True),
)
def test_consumers_beyond_the_queues_are_idle_under_averagely(
    n_queues: int, extra: int, cids: list[str]
) -> None:
    members = cids[: n_queues + extra]
    rb = rebalance("AVG", "CG", [Q("a", i) for i in range(n_queues)], members)
    sizes = [len(rb.ownership_by_cid[cid].result or []) for cid in rb.cid_all_sorted]
    assert sizes == [1] * n_queues + [0] * extra
