"""Read a recording one chunk ahead of its consumer, on a thread.

Triage alternates two kinds of work on each chunk: the reader's (Arrow's CSV parser, pyarrow.compute,
numpy - which release the GIL) and the classifier's (numpy and a Python loop over state changes).
:func:`read_ahead` lets the reader parse chunk N+1 while the caller classifies chunk N, so a machine
with two cores does both at once. The chunks come out in the same order, with the same contents; an
error the reader raises is raised to the caller at the same point (after every chunk before it), with
the same message; at most ``depth`` chunks wait (memory stays bounded), and a caller that stops early
stops the reader.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_CHUNK, _DONE, _ERROR = 0, 1, 2


def read_ahead(chunks: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Yield the items of ``chunks``, produced up to ``depth`` ahead on a thread of their own."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, not {depth}")
    waiting: queue.Queue[tuple[int, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[int, object]) -> bool:
        while not stop.is_set():
            try:
                waiting.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not put((_CHUNK, chunk)):
                    return
            put((_DONE, None))
        except BaseException as error:  # handed to the consumer, raised there
            put((_ERROR, error))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="recording-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = waiting.get()
            if kind == _CHUNK:
                yield value  # type: ignore[misc]
            elif kind == _DONE:
                return
            else:
                assert isinstance(value, BaseException)
                raise value
    finally:
        stop.set()
        thread.join()
