"""Reading a recording one chunk ahead (recordings.read_ahead): same chunks, same errors, bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from gpu_triage.recordings.read_ahead import read_ahead


def test_items_come_out_in_order_and_the_reader_runs_ahead_of_the_consumer() -> None:
    produced: list[int] = []

    def chunks() -> Iterator[int]:
        for i in range(5):
            produced.append(i)
            yield i

    out = []
    for item in read_ahead(chunks()):
        time.sleep(0.05)  # the consumer is slow: the producer has the next one ready
        assert len(produced) >= min(5, item + 2)
        out.append(item)
    assert out == [0, 1, 2, 3, 4]


def test_an_error_reaches_the_consumer_after_every_chunk_before_it() -> None:
    def chunks() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("file.csv:7:2: power.draw: x is not a number in W")

    got = []
    with pytest.raises(ValueError, match=r"^file.csv:7:2: power.draw: x is not a number in W$"):
        for item in read_ahead(chunks()):
            got.append(item)
    assert got == [1, 2]


def test_a_consumer_that_stops_early_stops_and_closes_the_reader() -> None:
    closed = threading.Event()
    produced: list[int] = []

    def chunks() -> Iterator[int]:
        try:
            for i in range(10_000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    it = read_ahead(chunks(), depth=2)
    assert next(it) == 0
    it.close()  # the for loop broke: the thread ends, the generator is closed
    assert closed.wait(5.0)
    assert len(produced) <= 4  # bounded: depth 2 waiting, one in hand, one being put
