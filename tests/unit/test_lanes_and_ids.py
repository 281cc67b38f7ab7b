import os
import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relayer import fnv1a_32, lane_for, uuid7
from relayer.ids import uuid7_time_ms
from relayer.store.relay import lane_bits


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0x811C9DC5), ("a", 0xE40C292C), ("foobar", 0xBF9CF968)],
)
def test_fnv1a_vectors_from_the_protocol(text: str, expected: int) -> None:
    assert fnv1a_32(text.encode()) == expected


def test_lane_is_the_hash_modulo_the_lane_count() -> None:
    assert lane_for("foobar", 64) == 0xBF9CF968 % 64
    assert lane_for("a", 1) == 0
    assert lane_for("a", 65_536) == 0xE40C292C % 65_536


def test_lane_hashes_utf8_bytes() -> None:
    assert lane_for("é", 1000) == fnv1a_32("é".encode()) % 1000


@given(st.text(), st.integers(min_value=1, max_value=65_536))
def test_lane_is_always_in_range(key: str, lanes: int) -> None:
    assert 0 <= lane_for(key, lanes) < lanes


@pytest.mark.parametrize("lanes", [0, -1, 65_537, True, 1.5, "8"])
def test_lane_count_out_of_range_is_rejected(lanes: object) -> None:
    with pytest.raises(ValueError, match="lanes"):
        lane_for("k", lanes)  # type: ignore[arg-type]


def test_lane_key_must_be_text() -> None:
    with pytest.raises(TypeError):
        lane_for(b"k", 8)  # type: ignore[arg-type]


def test_uuid7_has_version_7_and_rfc_variant() -> None:
    value = uuid7()
    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_uuid7_strictly_increases_within_a_process() -> None:
    ids = [uuid7() for _ in range(50_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    # PostgreSQL compares uuids bytewise: the byte order must agree with the integer order.
    assert [value.bytes for value in ids] == sorted(value.bytes for value in ids)


def test_uuid7_is_monotonic_across_threads() -> None:
    results: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def work(index: int) -> None:
        results[index].extend(uuid7() for _ in range(5_000))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [value for chunk in results for value in chunk]
    assert len(set(every)) == len(every)
    for chunk in results:
        assert chunk == sorted(chunk)


def test_uuid7_carries_the_current_millisecond() -> None:
    import time

    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= uuid7_time_ms(value) <= after + 1


def test_uuid7_blocks_interleave_in_order_with_single_ids() -> None:
    from relayer.ids import uuid7_block

    sequence = [uuid7(), *uuid7_block(1000), uuid7(), *uuid7_block(3), *uuid7_block(0), uuid7()]
    assert len(sequence) == 1006
    assert sequence == sorted(sequence)
    assert len(set(sequence)) == len(sequence)
    assert all(value.version == 7 for value in sequence)


def test_lane_bits_number_bits_as_postgres_get_bit_does() -> None:
    assert lane_bits([]) == b""
    assert lane_bits([0]) == b"\x01"
    assert lane_bits([9, 0]) == b"\x01\x02"  # lane 9: bit 1 of byte 1
    assert lane_bits({7, 8}) == b"\x80\x01"
    every = lane_bits(range(65_536))
    assert len(every) == 8192 and set(every) == {0xFF}


def test_uuid7_is_an_ordinary_uuid() -> None:
    """uuid7 sets UUID's attributes itself (UUID.__init__'s checks cost more than the rest of
    an id): the result is indistinguishable from UUID(int=...)."""
    import pickle
    from uuid import UUID, SafeUUID

    value = uuid7()
    same = UUID(int=value.int)
    assert value == same and hash(value) == hash(same) and str(value) == str(same)
    assert value.is_safe is SafeUUID.unknown and value.bytes == same.bytes
    assert pickle.loads(pickle.dumps(value)) == value
    assert UUID(str(value)) == value


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_does_not_reuse_its_parents_random_bytes() -> None:
    """The OS's random bytes are read for many milliseconds' counters at once: a child forked
    with some left must read its own, or parent and child would start their next
    milliseconds' counters at the same values."""
    from relayer.ids import _clock

    with _clock.lock:
        _clock._fresh_tail()  # bytes for more tails are left in the process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next tail, to the parent
        os.close(read)
        with _clock.lock:
            os.write(write, _clock._fresh_tail().to_bytes(10, "big"))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        childs = int.from_bytes(pipe.read(), "big")
    os.waitpid(pid, 0)
    with _clock.lock:
        assert _clock._fresh_tail() != childs
