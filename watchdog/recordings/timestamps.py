"""Vectorised parsing of nvidia-smi timestamps (``2025/07/27 00:34:45.155``) into epoch seconds.

Parsing a date per row with ``strptime`` (or even ``pyarrow.compute.strptime``) costs far more than the
whole rest of the reader, and Arrow's strptime does not take fractional seconds. This module exploits
two facts instead:

* the first 19 bytes (``YYYY/MM/DD HH:MM:SS``) are identical for every row logged within the same
  second - tens of rows at 10 Hz on 8 GPUs - so they are compared as three 8-byte words per row (one
  gather each), and only the first row of each run of equal words is decoded digit by digit;
* the fraction (``.155``) is a few digits at fixed positions after that, decoded for every row with one
  gather per digit.

Accepted: ``-`` as well as ``/`` between date parts, ``T`` as well as a space between date and time,
no fraction or 1-9 fraction digits. Times carry no zone in nvidia-smi logs; they are read as UTC
(nvidia-smi writes local time, so a recording is shifted by the recording host's UTC offset - harmless,
because triage reports times relative to the first sample).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

#: Byte positions of the digits of ``YYYY/MM/DD HH:MM:SS``.
_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])
_DAYS_IN_MONTH = np.array([0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])
#: Longest accepted cell: 19 + '.' + 9 fraction digits.
MAX_LENGTH = 29


def days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm, vectorised)."""
    y = year.astype(np.int64) - (month <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    m = month.astype(np.int64)
    doy = (153 * np.where(m > 2, m - 3, m + 9) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _decode_prefix(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since the epoch and a bad mask for an (n, 19) uint8 matrix of ``YYYY/MM/DD HH:MM:SS``."""
    digit = rows[:, _DIGITS].astype(np.int64) - 48
    bad = ((digit < 0) | (digit > 9)).any(axis=1)
    sep_date = (rows[:, 4] | 2) == ord("/")  # '/' is 0x2F and '-' is 0x2D
    sep_date &= (rows[:, 7] | 2) == ord("/")
    bad |= ~sep_date | (rows[:, 4] != rows[:, 7])
    bad |= (rows[:, 10] != ord(" ")) & (rows[:, 10] != ord("T"))
    bad |= (rows[:, 13] != ord(":")) | (rows[:, 16] != ord(":"))
    d = np.where(bad[:, None], 0, digit)
    year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
    month = d[:, 4] * 10 + d[:, 5]
    day = d[:, 6] * 10 + d[:, 7]
    hour = d[:, 8] * 10 + d[:, 9]
    minute = d[:, 10] * 10 + d[:, 11]
    second = d[:, 12] * 10 + d[:, 13]
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month_ok = (month >= 1) & (month <= 12)
    dim = _DAYS_IN_MONTH[np.where(month_ok, month, 0)] - ((month == 2) & ~leap)
    bad |= ~month_ok | (day < 1) | (day > dim) | (hour > 23) | (minute > 59) | (second > 60)
    seconds = days_from_civil(year, np.where(month_ok, month, 1), day) * 86_400
    seconds += hour * 3600 + minute * 60 + second
    return seconds, bad


def parse_timestamps(cells: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Parse trimmed timestamp cells; return ``(epoch_s float64, bad bool)``, one entry per cell.

    ``bad`` marks cells that are not a timestamp (their seconds are meaningless); the caller turns
    the first one into an error naming its line.
    """
    if isinstance(cells, pa.ChunkedArray):
        cells = cells.combine_chunks() if cells.num_chunks else pa.array([], pa.string())
    if cells.type != pa.string():
        cells = cells.cast(pa.string())
    n = len(cells)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    offsets = np.frombuffer(cells.buffers()[1], dtype=np.int32, count=n + 1, offset=cells.offset * 4)
    data_buffer = cells.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    data = data[: offsets[-1]]
    lengths = np.diff(offsets)
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest == longest and not cells.null_count and (shortest == 19 or 21 <= shortest <= MAX_LENGTH):
        return _parse_uniform(data[offsets[0] :], n, shortest)
    starts = offsets[:-1].astype(np.int64)
    valid = np.asarray(cells.is_valid()) if cells.null_count else None
    return parse_timestamp_cells(data, starts, lengths, valid)


def parse_timestamp_cells(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`parse_timestamps` of cells given as byte ranges of ``data`` (uint8): cell ``i`` is
    ``data[starts[i] : starts[i] + lengths[i]]``; ``valid`` marks the cells that exist (None: all).
    The reader's direct path hands its block's buffer here without building strings."""
    n = len(starts)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    ok_length = (lengths == 19) | ((lengths >= 21) & (lengths <= MAX_LENGTH))
    if valid is not None:
        ok_length &= valid
    if len(data) < 19 or not ok_length.any():
        return np.zeros(n), np.ones(n, dtype=bool)
    # Rows of a bad length read the first valid row's bytes (always in bounds) and are marked bad.
    first_ok = starts[np.argmax(ok_length)]
    index = np.where(ok_length, starts, first_ok)

    # Three overlapping 8-byte words cover bytes 0..18; equal words = equal date and time of day.
    words = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    w0, w1, w2 = words[index], words[index + 8], words[index + 11]
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(w0[1:], w0[:-1], out=change[1:])
    change[1:] |= w1[1:] != w1[:-1]
    change[1:] |= w2[1:] != w2[:-1]
    del w0, w1, w2
    firsts = np.flatnonzero(change)
    run_lengths = np.diff(np.append(firsts, n))
    prefix = data[index[firsts, None] + np.arange(19)]
    first_seconds, first_bad = _decode_prefix(prefix)
    seconds = np.repeat(first_seconds.astype(np.float64), run_lengths)
    bad = np.repeat(first_bad, run_lengths) | ~ok_length

    # Fraction: '.' at byte 19, then lengths - 20 digits.
    width = int(lengths[0])
    if 21 <= width <= 27 and bool(ok_length.all()) and int(lengths.min()) == int(lengths.max()):
        # one width everywhere: the '.' and the digits are the last bytes of one word per cell
        fraction, fraction_bad = _fractions(words[index + (width - 8)], width - 20)
        seconds += fraction / 10.0 ** (width - 20)
        return seconds, bad | fraction_bad
    has_fraction = ok_length & (lengths > 19)
    if has_fraction.any():
        digits_count = np.where(has_fraction, lengths - 20, 0)
        bad |= has_fraction & (data[np.where(has_fraction, index + 19, 0)] != ord("."))
        fraction = np.zeros(n, dtype=np.int64)
        for k in range(int(digits_count.max())):
            present = digits_count > k
            digit = data[np.where(present, index + 20 + k, 0)].astype(np.int64) - 48
            bad |= present & ((digit < 0) | (digit > 9))
            fraction = np.where(present, fraction * 10 + digit, fraction)
        seconds += fraction / np.power(10.0, digits_count)
    return seconds, bad


_DIGIT_ZEROS = np.uint64(0x3030303030303030)
_ALL_BYTES = np.uint64(0xFFFFFFFFFFFFFFFF)


def _fractions(word: np.ndarray, places: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``places`` fraction digits that end each 8-byte ``word`` (little-endian: the last digit in
    the highest byte) after a ``.``: (their value, bad mask)."""
    dot = np.uint64(8 * (7 - places))
    bad = ((word >> dot) & np.uint64(0xFF)) != np.uint64(ord("."))
    keep = _ALL_BYTES << (dot + np.uint64(8))
    value, ok = eight_digits((word & keep) | (_DIGIT_ZEROS & ~keep))
    return value, bad | ~ok


def eight_digits(word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, ok) of 8-byte words that should hold 8 ASCII digits (little-endian: the first digit in
    the lowest byte), with SWAR arithmetic: ``ok`` is False where a byte is no digit (simdjson's
    ``is_made_of_eight_digits_fast``), the value the digits' decimal number (``parse_eight_digits``)."""
    high = np.uint64(0xF0F0F0F0F0F0F0F0)
    ok = ((word & high) | (((word + np.uint64(0x0606060606060606)) & high) >> np.uint64(4))) == np.uint64(
        0x3333333333333333
    )
    v = word - _DIGIT_ZEROS
    v = v * np.uint64(10) + (v >> np.uint64(8))
    pairs = np.uint64(0x000000FF000000FF)
    v = (v & pairs) * np.uint64(100 + (1_000_000 << 32)) + ((v >> np.uint64(16)) & pairs) * np.uint64(
        1 + (10_000 << 32)
    )
    return v >> np.uint64(32), ok


def _parse_uniform(data: np.ndarray, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The common case: every cell has the same length, so the cells are rows of an (n, width) byte
    matrix and every access is a strided view instead of a gather."""
    matrix = data[: n * width].reshape(n, width)

    def word(offset: int) -> np.ndarray:
        return np.ndarray(shape=(n,), dtype="<u8", buffer=data, offset=offset, strides=(width,))

    change = np.empty(n, dtype=bool)
    change[0] = True
    for offset in (0, 8, 11):
        w = word(offset)
        if offset == 0:
            np.not_equal(w[1:], w[:-1], out=change[1:])
        else:
            change[1:] |= w[1:] != w[:-1]
    firsts = np.flatnonzero(change)
    run_lengths = np.diff(np.append(firsts, n))
    first_seconds, first_bad = _decode_prefix(matrix[firsts, :19])
    seconds = np.repeat(first_seconds.astype(np.float64), run_lengths)
    bad = np.repeat(first_bad, run_lengths)
    if width > 19:
        bad |= matrix[:, 19] != ord(".")
        fraction: np.ndarray[Any, np.dtype[np.signedinteger[Any]]] = np.zeros(
            n, dtype=np.int32 if width <= 28 else np.int64
        )
        highest = np.zeros(n, dtype=np.uint8)
        for k in range(20, width):
            digit = matrix[:, k] - np.uint8(48)  # wraps below '0', so "> 9" catches both sides
            np.maximum(highest, digit, out=highest)
            fraction *= 10
            fraction += digit
        bad |= highest > 9
        seconds += fraction / 10.0 ** (width - 20)
    return seconds, bad
