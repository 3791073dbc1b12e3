"""A string column as codes into its distinct values, for rules that depend on the value alone.

A generation, a status code, an error class, a dictionary code in the state: each is computed once
per distinct value and spread back by code. The readers send low-cardinality strings dictionary-
encoded, so from Arrow the codes come with the column, and a million events never become a million
Python strings only to be hashed again. ``words`` holds the values the rows use, each once, in no
particular order: what is computed from them must not depend on their order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

NULL = -1  # the code of a null value


@dataclass(frozen=True)
class Coded:
    codes: np.ndarray  # int64 per row: a position in ``words``, or NULL
    words: np.ndarray  # object array: the distinct non-null values the rows use

    @staticmethod
    def of(values: np.ndarray) -> Coded:
        """``values`` (an object array; None is null) factorized."""
        codes, uniques = pd.factorize(pd.Series(values, dtype=object))
        return Coded(codes.astype(np.int64, copy=False), _objects(list(uniques)))

    @staticmethod
    def of_arrow(column: pa.Array | pa.ChunkedArray) -> Coded:
        """A string column, dictionary-encoded or not (chunks with their own dictionaries too)."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()  # one dictionary for every chunk
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        codes = column.indices.fill_null(NULL).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return _unique_words(codes, column.dictionary.to_pylist())

    def take(self, rows: np.ndarray) -> Coded:
        """The rows at ``rows`` (positions or a mask)."""
        return Coded(self.codes[rows], self.words).compact()

    def compact(self) -> Coded:
        """The same values with ``words`` cut to those the rows use."""
        used = np.bincount(self.codes + 1, minlength=len(self.words) + 1)[1:] > 0
        if used.all():
            return self
        keep = np.flatnonzero(used)
        remap = np.full(len(self.words) + 1, NULL, dtype=np.int64)  # the last slot: NULL stays NULL
        remap[keep] = np.arange(len(keep))
        return Coded(remap[self.codes], self.words[keep])

    def values(self) -> np.ndarray:
        """One object per row (None where null)."""
        return np.concatenate([self.words, _objects([None])])[self.codes]

    def table(self, value_of: Callable[[Any], Any], dtype: Any) -> np.ndarray:
        """``value_of`` per row, called once per distinct value (and once for null)."""
        out = np.empty(len(self.words) + 1, dtype=dtype)
        out[:] = [value_of(w) for w in self.words.tolist()] + [value_of(None)]
        return out[self.codes]  # NULL indexes the last slot

    def map(self, value_of: Callable[[Any], Any]) -> Coded:
        """``value_of`` per row (called once per distinct value and for null), as codes."""
        results = [value_of(w) for w in self.words.tolist()] + [value_of(None)]
        return _unique_words(np.append(np.arange(len(self.words)), len(self.words))[self.codes], results)


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _unique_words(codes: np.ndarray, words: list[Any]) -> Coded:
    """Codes into ``words``, which may repeat a value or hold None: codes into their distinct values."""
    index: dict[Any, int] = {}
    remap = [NULL if w is None else index.setdefault(w, len(index)) for w in words]
    if len(index) != len(words):
        codes = np.asarray(remap + [NULL], dtype=np.int64)[codes]
    return Coded(codes, _objects(list(index))).compact()
