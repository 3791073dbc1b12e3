"""A minimal immutable column table (name -> numpy array) and string dictionaries.

pandas frames copy and re-consolidate on every ``assign``; the lag state replaces a few columns of
200,000-row tables each batch, so plain arrays with positional ``take`` are both simpler and faster.
Group, topic and broker names are stored once in dictionaries and referred to by integer codes,
which turns every join of the step into ``np.searchsorted`` on int64 keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

I64 = np.int64


@dataclass(frozen=True)
class Table:
    cols: Mapping[str, np.ndarray]

    @staticmethod
    def empty(schema: Mapping[str, str]) -> Table:
        return Table({name: np.empty(0, dtype=dtype) for name, dtype in schema.items()})

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    @property
    def names(self) -> list[str]:
        return list(self.cols)

    def take(self, positions: np.ndarray) -> Table:
        return Table({k: v[positions] for k, v in self.cols.items()})

    def replace(self, **cols: np.ndarray) -> Table:
        unknown = set(cols) - set(self.cols)
        if unknown:
            raise KeyError(f"unknown columns {sorted(unknown)}; table has {self.names}")
        return Table({**self.cols, **cols})

    def append(self, rows: Mapping[str, np.ndarray]) -> Table:
        """Rows given as full columns (missing or extra names are a bug)."""
        if set(rows) != set(self.cols):
            raise KeyError(f"append needs exactly {self.names}, got {sorted(rows)}")
        return Table(
            {k: np.concatenate([v, np.asarray(rows[k], dtype=v.dtype)]) for k, v in self.cols.items()}
        )

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(dict(self.cols))


def encode(names: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of ``values`` in the dictionary ``names``, adding unseen names (in sorted order)."""
    if len(values) == 0:
        return np.empty(0, dtype=I64), names
    codes = pd.Index(names, dtype=object).get_indexer(values).astype(I64)
    missing = codes < 0
    if missing.any():
        fresh = np.array(sorted(set(values[missing].tolist())), dtype=object)
        names = np.concatenate([names, fresh]).astype(object)
        codes[missing] = len(names) - len(fresh) + np.searchsorted(fresh, values[missing])
    return codes, names


def lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``keys`` in ``sorted_keys`` and whether each was found."""
    pos = np.searchsorted(sorted_keys, keys)
    found = pos < len(sorted_keys)
    found[found] = sorted_keys[pos[found]] == keys[found]
    return pos, found


def unique_ints(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (numpy's hash-based ``unique`` is ~100x slower on int64 here)."""
    s = np.sort(values)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def first_of_each(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and the position of each one's first occurrence."""
    order = np.argsort(values, kind="stable")
    s = values[order]
    keep = np.r_[True, s[1:] != s[:-1]] if len(s) else np.zeros(0, dtype=bool)
    return s[keep], order[keep]


def last_of_each(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and the position of each one's last occurrence."""
    uniq, first_reversed = first_of_each(values[::-1])
    return uniq, len(values) - 1 - first_reversed
