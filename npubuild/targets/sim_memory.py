"""The simulator's memories: SRAM and DRAM as byte rows, one per image of a batch.

Views of them put the images first. Building a view costs more than a small tile's arithmetic,
so a stream's views are kept (a view of the fixed buffer stays valid). Ranges that hold the same
bytes in every image, the constants and what a DMA copied from them, carry a token that names
those bytes, so that a layer's weights, parameters and tables are compared across the images
once, not at every instruction that reads them.
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.targets.npub import NpubError

VIEWS_KEPT = 1 << 16  # a large stream's distinct views; beyond that they are built again

DTYPES = {8: np.dtype("<i1"), 16: np.dtype("<i2"), 32: np.dtype("<i4"), 64: np.dtype("<i8")}


class Uneven(Exception):
    """An operand meant to be a constant differs between the images of a batch."""


class Memory:
    """One address space of `size` bytes per image of a batch (`batch` rows). Views put the
    images first: rows `first` to `first + rows` of it (all of them unless a smaller batch or one
    image at a time is running)."""

    def __init__(self, name: str, size: int, batch: int = 1):
        self.name = name
        self.size = size
        self.buffer = bytearray(size * batch)
        self.data = np.frombuffer(self.buffer, np.uint8).reshape(batch, size)
        self.first, self.rows = 0, batch
        self.high_water = 0
        # views by (where, what shape, which rows): a stream's instructions ask for the same
        # ones every run, and a view of the fixed buffer stays valid; building one costs more
        # than the small tiles' arithmetic
        self._views: dict[tuple, tuple[np.ndarray, int]] = {}
        # byte ranges [addr, end) that hold the same bytes in every image, each with a token that
        # names those bytes (equal tokens, equal bytes): the constants section, and what a DMA
        # copied from it; forgotten when anything writes over them
        self._known: dict[tuple[int, int], object] = {}

    def mark(self, addr: int, end: int, token: object) -> None:
        """[addr, end) holds the same bytes in every image of the rows now in use, named by
        `token`."""
        if end > addr:
            self._known[(addr, end)] = (token, self.first, self.first + self.rows)

    def forget(self, addr: int, end: int) -> None:
        """Something wrote over [addr, end): the ranges it touches are no longer known."""
        if self._known:
            for a, e in [r for r in self._known if r[0] < end and addr < r[1]]:
                del self._known[(a, e)]

    def _covers(self, rows: tuple[int, int]) -> bool:
        return rows[0] <= self.first and self.first + self.rows <= rows[1]

    def token_within(self, addr: int, end: int) -> tuple | None:
        """The token of a known range holding all of [addr, end) in the rows in use, and the offset."""
        for (a, e), (token, *rows) in self._known.items():
            if a <= addr and end <= e and self._covers(rows):
                return token, addr - a
        return None

    def same_in_every_row(self, addr: int, bits: int, shape) -> tuple[np.ndarray, object]:
        """The one value every image holds at addr (weights, parameters, tables: loaded from the
        constants) and its name, None where the rows had to be compared; Uneven where they
        differ. A layer's constants lie inside the range its group's one DMA made known: named by
        that range's token, where in it they start and how many bytes they take."""
        rows = self.view(addr, bits, shape)
        within = self.token_within(addr, addr + rows[0].nbytes)
        if within is not None:
            return rows[0], (*within, rows[0].nbytes)
        return common_row(rows), None

    def strided(self, addr: int, dtype: np.dtype, shape: tuple, strides: tuple) -> np.ndarray:
        """The rows' elements at `addr` with the given shape and element strides (in elements);
        the caller has checked that they lie inside the memory."""
        key = ("strided", addr, dtype.char, shape, strides, self.first, self.rows)
        known = self._views.get(key)
        if known is not None:
            return known[0]
        array = self._array(addr, dtype, shape, strides)
        self._remember(key, array, 0)
        return array

    def _array(self, addr: int, dtype: np.dtype, shape: tuple, strides: tuple) -> np.ndarray:
        return np.ndarray(
            (self.rows, *shape),
            dtype,
            self.buffer,
            self.first * self.size + addr,
            (self.size, *(s * dtype.itemsize for s in strides)),
        )

    def _remember(self, key: tuple, array: np.ndarray, end: int) -> None:
        if len(self._views) >= VIEWS_KEPT:
            self._views.clear()
        self._views[key] = (array, end)

    def view(self, addr: int, bits: int, shape, write: bool = False) -> np.ndarray:
        """[rows, *shape] elements of `bits` at addr, row-major in each image's memory."""
        key = ("view", addr, bits, tuple(shape), self.first, self.rows)
        known = self._views.get(key)
        if known is not None:  # checked when it was first built
            if write:
                self.high_water = max(self.high_water, known[1])
                self.forget(addr, known[1])
            return known[0]
        dtype = DTYPES.get(bits)
        if dtype is None:
            raise NpubError(f"{self.name}: unsupported element width {bits}")
        shape = tuple(map(int, shape))
        count = math.prod(shape)
        if addr < 0 or (shape and min(shape) < 0):
            raise NpubError(f"{self.name}: negative address or extent")
        end = addr + count * dtype.itemsize
        if end > self.size:
            raise NpubError(f"{self.name}: access [{addr:#x}, {end:#x}) is outside its {self.size} bytes")
        if write:
            self.high_water = max(self.high_water, end)
            self.forget(addr, end)
        strides, step = [], 1
        for extent in reversed(shape):
            strides.append(step)
            step *= extent
        array = self._array(addr, dtype, shape, tuple(reversed(strides)))
        self._remember(key, array, end)  # under its own key only: one entry per view
        return array

    def write(self, addr: int, bits: int, values: np.ndarray) -> None:
        """values: [rows, *shape], one block per image."""
        target = self.view(addr, bits, values.shape[1:], write=True)
        target[...] = values


def common_row(rows: np.ndarray) -> np.ndarray:
    """The one value of an operand that every image of the batch holds alike (weights, tables,
    requantization parameters: loaded from the constants); Uneven when a stream made them differ."""
    first = rows[0]
    if rows.shape[0] > 1 and not (rows[1:] == first).all():
        raise Uneven
    return first
