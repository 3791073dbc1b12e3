"""KRaft cluster ids for the test broker's storage format step."""

from __future__ import annotations

import base64

from pipeline.kafka_apache import _cluster_id


def test_cluster_ids_are_16_random_bytes_and_never_look_like_an_option() -> None:
    # One urlsafe base64 id in 64 starts with "-", which the format step took for an option and failed.
    ids = [_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
