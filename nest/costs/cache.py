"""One Problem's derived tables: the one store that keeps them, with one eviction rule.

A Problem (nest.problem.problem) owns exactly one ProblemCache; a new problem (every `with_*`) starts with
an empty one, so no two problems share an entry. What it keeps, by store:
    ("layer_tables", modes)        key variant: nest.costs.layers.LayerTable
    "layer_times"                  key variant: its layers' nest.costs.table.LayerTimes
    ("derived", variant, modes)    per layer table: group terms and data-parallel lines
                                   (nest.costs.groups), the stage kernel's [b, a] grids
                                   (nest.costs.stage), stash capacities (nest.solver.bounds)
    "with_mbs"                     key mbs: the problem at that micro-batch size (frozen)
    solver stores                  nest.solver's bounds and screens, kept across its searches
Entries are immutable (frozen dataclasses, read-only arrays: `read_only`), so what one caller is
handed cannot change what the next one reads; but for two memo stores of the solver
("joint_minmax", "union_joint", "interleaved_fits": dicts of values of pure functions of their key, each
value written once or replaced by the same function's value at another stop, never changed
by a reader). The eviction rule: each store keeps its ENTRIES (STORE_ENTRIES for the stores named
there) most recently used entries (an evicted entry is recomputed, to the same bytes, when asked again).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from types import MappingProxyType

import numpy as np

ENTRIES = 512  # per store; each entry holds O(L^2) floats at most, bounded so memory stays small
# stores of small entries that a `nest plan` asks for again after more than ENTRIES others (the
# 24 (micro-batch, ZeRO, recomputation) searches and the search on all devices revisit the same
# (class, p, d) and placements): a float or two each, or a placement's interned priced-alike keys
# (nest.costs.alike.priced_alike_keys: a list of references to a few distinct keys)
STORE_ENTRIES = {"memory_aware_bound": 65536, "joint_minmax": 65536, "union_joint": 65536,
                 "priced_alike_keys": 8192}


class ProblemCache:
    """The derived tables of one Problem (module docstring), least recently used evicted."""

    def __init__(self, entries: int = ENTRIES):
        self.entries = entries
        self._stores: dict[Hashable, OrderedDict] = {}

    def get(self, store: Hashable, key: Hashable, make: Callable[[], object]):
        """The entry `key` of `store`, made by make() on a miss (the one eviction rule here)."""
        s = self._stores.setdefault(store, OrderedDict())
        if key in s:
            s.move_to_end(key)
            return s[key]
        out = s[key] = make()
        if len(s) > max(self.entries, STORE_ENTRIES.get(store, 0)):
            s.popitem(last=False)
        return out

    def items(self):
        """(store, key, entry) of every entry kept, oldest first within a store."""
        for store, s in self._stores.items():
            for key, entry in s.items():
                yield store, key, entry

    def __len__(self) -> int:
        return sum(len(s) for s in self._stores.values())


def read_only(x):
    """x with every array in it made read-only (arrays, dicts -> read-only mappings, tuples,
    lists -> tuples): what a cache hands out cannot be written through."""
    if isinstance(x, np.ndarray):
        x.setflags(write=False)
        return x
    if isinstance(x, dict):
        return MappingProxyType({k: read_only(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return tuple(read_only(v) for v in x)
    return x
