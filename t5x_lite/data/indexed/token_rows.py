"""Packed LM rows cut from a split's token stream: pure functions, no files.

The stream is every document's tokens followed by EOS, in index order. Row r of length L is
stream positions [r * L, (r + 1) * L): rows are full (only the stream's last row may be
short), their number is ceil(stream length / L) whatever the order they are read in, and a
document longer than a row continues in the next one. Each document's piece in a row is one
segment, as seqio's packing gives it: targets are the piece, inputs the piece shifted right
with the decoder start id at the segment's start, positions count from 0 in each piece, and
the loss weight is 1 on every token (padding, only in the last row, is 0 everywhere).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

FEATURES = ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights",
            "decoder_segment_ids", "decoder_positions")


def num_rows(stream_tokens: int, length: int) -> int:
    """How many rows of `length` the stream fills (the last may be short)."""
    return math.ceil(stream_tokens / length)


def row_span(row: int, *, length: int, stream_tokens: int) -> tuple[int, int]:
    """The stream positions [start, stop) of `row`."""
    return row * length, min((row + 1) * length, stream_tokens)


def lm_row(pieces: Sequence[np.ndarray], *, length: int, start_id: int) -> dict[str, np.ndarray]:
    """The model features of one row made of `pieces` (each a document's tokens in the row, in order)."""
    targets = np.zeros(length, np.int32)
    inputs = np.zeros(length, np.int32)
    segments = np.zeros(length, np.int32)
    positions = np.zeros(length, np.int32)
    at = 0
    for segment, piece in enumerate(pieces, start=1):
        n = len(piece)
        targets[at:at + n] = piece
        inputs[at] = start_id
        inputs[at + 1:at + n] = piece[:-1]
        segments[at:at + n] = segment
        positions[at:at + n] = np.arange(n)
        at += n
    if at > length:
        raise ValueError(f"pieces hold {at} tokens, more than the row's {length}")
    return {"decoder_target_tokens": targets, "decoder_input_tokens": inputs,
            "decoder_loss_weights": (segments > 0).astype(np.int32),
            "decoder_segment_ids": segments, "decoder_positions": positions}


def empty_rows(rows: int, length: int) -> dict[str, np.ndarray]:
    """`rows` all-padding rows (zero loss weight), for positions past the end of an epoch."""
    return {k: np.zeros((rows, length), np.int32) for k in FEATURES}


def pieces_of_row(documents: Sequence[np.ndarray], starts: Sequence[int], *, span: tuple[int, int],
                  eos_id: int) -> list[np.ndarray]:
    """The pieces of the documents (tokens without EOS, starting at stream positions `starts`)
    that fall into the stream span [start, stop)."""
    start, stop = span
    pieces = []
    for tokens, first in zip(documents, starts):
        document = np.append(tokens.astype(np.int32), np.int32(eos_id))
        lo, hi = max(start, first) - first, min(stop, first + len(document)) - first
        if hi > lo:
            pieces.append(document[lo:hi])
    return pieces
