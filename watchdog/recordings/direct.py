"""A block of complete lines -> column arrays straight from the bytes, with numpy: the fast path.

nvidia-smi writes every line alike (``2025/07/27 00:34:45.155, 72.36 W, 0 %, 131 MiB``), so the
usual block needs neither a CSV parser nor strings: one vectorised pass finds the separators
(``,`` and ``\\n``), each row's fields are then byte ranges of the block, and each wanted column is
decoded from the block's own buffer with a few gathers and array arithmetic per column - no Python
per row or per cell, no copy of the text:

* a number cell (``" 72.36 W"``, ``" 0 %"``, ``" 131"``) is one 8-byte word read where the cell
  ends: the unit suffix compared as one integer, the decimal point checked at its place and taken
  out, the digits checked and summed with SWAR arithmetic
  (:func:`~gpu_triage.recordings.timestamps.eight_digits`), the integer divided
  by a power of ten - exactly the correctly rounded double Arrow's cast gives (an integer of at most
  8 digits and a power of ten are both exact doubles, so one IEEE division rounds the true quotient);
* timestamps go through :func:`gpu_triage.recordings.timestamps.parse_timestamp_cells` (the same
  decoding the Arrow path uses);
* GPU indices are small integers, decoded the same way.

Anything this path does not vouch for - a line with another field count, a blank line, a carriage
return, a missing value (``[N/A]``), other blanks than the one space after a comma, a unit on some
cells only, a number of more than 8 characters, decimals that differ from the first row's, an exponent
or sign, an implausible timestamp, a uuid column naming GPUs - makes :func:`parse_direct`
return None, and the caller parses the block the careful way (``pyarrow.csv`` and
:mod:`gpu_triage.recordings.cells`), which gives the same arrays or names the bad line and field.
So a clean block costs a few passes over its bytes; an odd one costs what it always did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_triage.model.limits import MAX_GPUS
from gpu_triage.recordings.cells import EARLIEST_TIME_S, LATEST_TIME_S, scale_in_place
from gpu_triage.recordings.layout import Layout
from gpu_triage.recordings.timestamps import eight_digits, parse_timestamp_cells

#: Exact powers of ten (every one up to 10^22 is a double).
_POW10 = np.array([float(10**k) for k in range(23)])
_COMMA, _NEWLINE, _SPACE, _DOT = 44, 10, 32, 46


class DirectColumns:
    """The decoded columns of one block: ``values`` per attribute, ``time_s``, ``index`` (or None)."""

    __slots__ = ("index", "rows", "time_s", "values")

    def __init__(
        self, rows: int, values: dict[str, np.ndarray], time_s: np.ndarray | None, index: np.ndarray | None
    ) -> None:
        self.rows = rows
        self.values = values
        self.time_s = time_s
        self.index = index


def usable(layout: Layout, extra: bool) -> bool:
    """Whether blocks of ``layout`` may take this path: not where a row's GPU is its uuid/bus id
    (those stay strings), not for the header probe (``extra``) of a file with a ``name`` or uuid/bus
    id column (read as strings too), and not for one-column files (a blank-looking line there is a
    value)."""
    strings = layout.label is not None and (extra or layout.index is None)
    return layout.ncols >= 2 and not strings and not (extra and layout.name is not None)


#: Bytes decoded at a time: the arrays of a piece this size stay in the CPU's caches (measured on
#: the 4.8 M-row benchmark file: 2 MiB pieces take about 30 % less CPU than 16 MiB ones).
PIECE_BYTES = 2 << 20


def parse_direct(raw: np.ndarray, buffer: Any, rows: int, layout: Layout) -> DirectColumns | None:
    """Decode the ``rows`` complete lines of ``raw`` (uint8, ending in ``\\n``; ``buffer`` holds the
    same bytes, for byte searches) into arrays, or None when the block needs the careful path. Big
    blocks are decoded in pieces of about :data:`PIECE_BYTES` (cut at line ends) into the arrays."""
    if rows == 0 or buffer.find(b"\r", 0, len(raw)) >= 0:
        return None
    values = {attribute: np.empty(rows) for attribute in layout.numeric}
    time_s = np.empty(rows) if layout.timestamp is not None else None
    index = np.empty(rows, dtype=np.int32) if layout.index is not None else None
    begin = row = 0
    while begin < len(raw):
        end = (
            len(raw)
            if len(raw) - begin <= PIECE_BYTES
            else buffer.rfind(b"\n", begin, begin + PIECE_BYTES) + 1
        )
        if end <= begin:  # one line longer than a piece
            end = len(raw)
        piece = _parse_piece(raw[begin:end], rows - row if end == len(raw) else -1, layout)
        if piece is None:
            return None
        count = piece.rows
        if row + count > rows:
            return None
        for attribute, array in piece.values.items():
            values[attribute][row : row + count] = array
        if time_s is not None and piece.time_s is not None:
            time_s[row : row + count] = piece.time_s
        if index is not None and piece.index is not None:
            index[row : row + count] = piece.index
        begin, row = end, row + count
    return DirectColumns(rows, values, time_s, index) if row == rows else None


def _parse_piece(raw: np.ndarray, rows: int, layout: Layout) -> DirectColumns | None:
    """:func:`parse_direct` of one piece of complete lines (``rows`` of them; -1: count them)."""
    ncols = layout.ncols
    newline = raw == _NEWLINE
    if rows < 0:
        rows = int(np.count_nonzero(newline))
    found = np.flatnonzero(newline | (raw == _COMMA))
    del newline
    if rows == 0 or len(found) != rows * ncols:
        return None
    seps = found.reshape(rows, ncols)
    if not (raw[seps[:, -1]] == _NEWLINE).all():
        return None  # `rows` newlines in all, each closing a row: the other separators are commas
    words = (
        np.ndarray(shape=(len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,)) if len(raw) >= 8 else None
    )

    def field(pos: int) -> tuple[np.ndarray, np.ndarray]:
        end = seps[:, pos]
        if pos:
            return seps[:, pos - 1] + 1, end
        start = np.empty(rows, dtype=end.dtype)
        start[0] = 0
        start[1:] = seps[:-1, -1] + 1
        return start, end

    values: dict[str, np.ndarray] = {}
    for attribute, (pos, suffix, scale, _name) in layout.numeric.items():
        start, end = field(pos)
        number = _numbers(raw, words, start, end, suffix.encode(), lead=min(pos, 1))
        if number is None:
            return None
        values[attribute] = scale_in_place(number, scale)
    time_s = index = None
    if layout.timestamp is not None:
        start, end = field(layout.timestamp)
        if (raw[start] == _SPACE).all():
            start = start + 1  # " 2025/07/27 ...": the careful path trims it too
        time_s, bad = parse_timestamp_cells(raw, start, end - start)
        if bad.any() or ((time_s < EARLIEST_TIME_S) | (time_s > LATEST_TIME_S)).any():
            return None
    if layout.index is not None:
        start, end = field(layout.index)
        board = _numbers(raw, words, start, end, b"", integer=True, lead=min(layout.index, 1))
        if board is None or not (board < MAX_GPUS).all():
            return None
        index = board.astype(np.int32)
    return DirectColumns(rows, values, time_s, index)


_ZEROS = np.uint64(0x3030303030303030)  # "00000000"
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


def _word_ending(raw: np.ndarray, words: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The 8 bytes before each of ``end`` (increasing) as little-endian words; bytes before the
    block's start read as 0 (only the first rows of a block can end within its first 8 bytes)."""
    out = words[end - 8]
    if int(end[0]) < 8:
        head = np.zeros(24, dtype=np.uint8)
        head[8 : 8 + min(16, len(raw))] = raw[:16]
        head_words = np.ndarray(shape=(17,), dtype="<u8", buffer=head, strides=(1,))
        at = np.flatnonzero(end < 8)
        out[at] = head_words[end[at]]  # raw[end - 8 : end] is head[end : end + 8]
    return out


def _numbers(
    raw: np.ndarray,
    words: np.ndarray | None,
    start: np.ndarray,
    end: np.ndarray,
    suffix: bytes,
    integer: bool = False,
    lead: int = 1,
) -> np.ndarray | None:
    """float64 values of cells ``" <digits>[.<digits>]<suffix>"`` (``lead=0``: the first field of a
    line, without the space) - the suffix on every cell or on none, at most 8 characters between the
    space and the suffix, the point (if any) equally far from the end in every cell (nvidia-smi prints
    ``%.2f`` watts and whole percents and MiB) - or None when any cell is something else.
    """
    if words is None or len(raw) < 16 or (lead and not (raw[start] == _SPACE).all()):
        return None
    cut = len(suffix)
    last = _word_ending(raw, words, end)  # the cell's last 8 bytes: its last character highest
    if cut:
        with_unit = (last >> np.uint64(8 * (8 - cut))) == np.uint64(int.from_bytes(suffix, "little"))
        if not with_unit.all():
            if with_unit.any():
                return None
            cut = 0
    length = end - start - lead - cut  # characters of the number
    if int(length.min()) < 1 or int(length.max()) > 8:
        return None
    # the number right-aligned in one word (bytes before it are masked below)
    word = (
        last
        if not cut
        else last << np.uint64(8 * cut)
        if int(length.max()) <= 8 - cut
        else _word_ending(raw, words, end - cut)
    )
    end = end - cut
    first = raw[int(start[0]) + lead : int(end[0])].tobytes()  # the first cell says where the point is
    places = len(first) - 1 - first.find(b".") if b"." in first and not integer else 0
    keep = np.left_shift(_ALL, (8 * (8 - length)).astype(np.uint64))  # the number's bytes
    if places:
        if int(length.min()) < places + 2:
            return None
        dot = np.uint64(8 * (7 - places))
        ok = ((word >> dot) & np.uint64(0xFF)) == np.uint64(_DOT)
        upto = np.uint64((1 << (int(dot) + 8)) - 1)  # the bytes up to the point
        word = ((word << np.uint64(8)) & upto) | (word & ~upto)  # the integer part moved over it
        keep = keep << np.uint64(8)
    else:
        ok = None
    word = (word & keep) | (_ZEROS & ~keep)
    value, digits_ok = eight_digits(word)
    ok = digits_ok if ok is None else ok & digits_ok
    if not ok.all():
        return None
    number = value.astype(np.float64)
    if places:
        number /= _POW10[places]
    return number
