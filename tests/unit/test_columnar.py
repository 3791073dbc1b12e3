"""The column-wise validator never passes a record that the per-record check rejects."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.columnar import _field_by_field, _whole_batch, validate_columns
from schemas.events import EVENTS, ConsumerProgress, GroupMembership, SendResult
from schemas.fields import Invalid, check_record

BASE = {
    "send_result": orjson.loads(SendResult("e", 1_700_000_000_000, "c", "pg", "cid", "4.9.8", "T", "b", 1, "SEND_OK", 5, None, 3, 0).to_json()),
    "consumer_progress": orjson.loads(ConsumerProgress(1_700_000_000_000, "c", "g", "T", "b", 0, 5).to_json()),
    "group_membership": orjson.loads(GroupMembership(1_700_000_000_000, "c", "g", "T", ("a",)).to_json()),
}
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
    st.text(max_size=5), st.sampled_from(["", "SEND_OK", "FAILED", "AVG", "x" * 600]),
    st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, object]:
    kind = draw(st.sampled_from(sorted(EVENTS)))
    obj = dict(BASE[kind])
    for name in draw(st.lists(st.sampled_from([f.name for f in EVENTS[kind]]), max_size=3)):
        if draw(st.booleans()):
            obj.pop(name, None)
        else:
            obj[name] = draw(ODD_VALUES)
    if draw(st.integers(0, 20)) == 0:
        return kind, draw(st.sampled_from([[], "str", 3, None]))
    return kind, obj


@settings(max_examples=400, deadline=None)
@given(st.lists(mutated(), min_size=1, max_size=12))
def test_columnar_verdicts_agree_with_check_record(cases: list[tuple[str, object]]) -> None:
    for kind in {k for k, _ in cases}:
        objs = [o for k, o in cases if k == kind]
        agree_with_check_record(kind, objs, *validate_columns(EVENTS[kind], objs))


def agree_with_check_record(kind: str, objs: list[object], arrays: dict, suspects: set[int], exact: bool = False) -> None:
    """Every row check_record rejects is a suspect; a row trusted (not a suspect) has exactly the
    checked row's columns. ``exact``: no row check_record accepts is a suspect either."""
    for i, obj in enumerate(objs):
        try:
            expected = check_record(EVENTS[kind], obj)
        except Invalid:
            assert i in suspects, (kind, obj)
            continue
        assert not (exact and i in suspects), (kind, obj)
        if i not in suspects:
            assert {n: arrays[n][i].as_py() for n in expected} == expected


def _typed_value(kind: str) -> st.SearchStrategy[object]:
    """Values of the field's own JSON type, inside or outside its rules (bounds, enum, length), or null."""
    return {
        "string": st.one_of(st.sampled_from(["", "SEND_OK", "FAILED", "AVG", "x" * 600, "x" * 3000]), st.text(max_size=4)),
        "int64": st.integers(min_value=-(2**62), max_value=2**62),
        "int32": st.integers(min_value=-(2**31), max_value=2**31 - 1),
        "bool": st.booleans(),
        "list<string>": st.lists(st.one_of(st.text(max_size=3), st.none()), max_size=3),
    }[kind] | st.none()


@st.composite
def typed(draw: st.DrawFn, kind: str) -> dict[str, object]:
    obj = dict(BASE[kind])
    for f in draw(st.lists(st.sampled_from(EVENTS[kind]), max_size=3)):
        if draw(st.booleans()):
            obj.pop(f.name, None)
        else:
            obj[f.name] = draw(_typed_value(f.kind))
    return obj


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_whole_batch_route_agrees_with_check_record(data: st.DataObject) -> None:
    """Batches whose values all have their field's type take the one-pass route; its verdicts and
    columns are those of check_record, and of the field-by-field route."""
    kind = data.draw(st.sampled_from(sorted(EVENTS)))
    objs = data.draw(st.lists(typed(kind), min_size=1, max_size=10))
    fast = _whole_batch(EVENTS[kind], objs)
    assert fast is not None
    arrays, suspects = fast
    agree_with_check_record(kind, objs, arrays, suspects, exact=True)
    slow_arrays, slow_suspects = _field_by_field(EVENTS[kind], objs)
    assert slow_suspects == suspects
    good = [i for i in range(len(objs)) if i not in suspects]
    for name in arrays:
        assert [arrays[name][i].as_py() for i in good] == [slow_arrays[name][i].as_py() for i in good], name


def test_values_arrow_would_convert_silently_take_the_field_by_field_route() -> None:
    objs = [dict(BASE["send_result"], queue_id=1.0), dict(BASE["send_result"])]
    assert _whole_batch(EVENTS["send_result"], objs) is None
    _, suspects = validate_columns(EVENTS["send_result"], objs)
    assert suspects == {0}
