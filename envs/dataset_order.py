"""Seed -> row order for dataset envs: a keyed permutation per epoch, computed in O(1).

Seed ``s`` of an env over ``n`` rows is position ``s % n`` of epoch ``s // n``; each epoch
visits every row once, in an order fixed by ``(shuffle_seed, epoch)``. The permutation is a
small Feistel network with cycle walking, so nothing of size ``n`` is ever materialised:
a 1M-row dataset costs the same per reset as a 10-row one, and random seeds (the trainer
draws them uniformly) never force a new permutation array to be built.
"""

from __future__ import annotations

import threading

_MASK64 = (1 << 64) - 1
_ROUNDS = 4


def mix64(x: int) -> int:
    """splitmix64's finaliser: a fast, well-mixed 64-bit hash of an integer."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class KeyedPermutation:
    """A bijection of ``range(n)`` chosen by ``key``; ``perm(i)`` for one index at a time."""

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits % 2
        self._half = bits // 2
        self._mask = (1 << self._half) - 1
        self._keys = [mix64(key * 0x9E3779B97F4A7C15 + r + 1) for r in range(_ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (mix64(right ^ k) & self._mask)
        return (left << self._half) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside range({self.n})")
        x = self._encrypt(i)
        while x >= self.n:  # cycle walking: the domain is < 4n, so ~2 rounds on average
            x = self._encrypt(x)
        return x


def epoch_key(shuffle_seed: int, epoch: int) -> int:
    return mix64((int(shuffle_seed) & _MASK64) * 0x100000001B3 ^ mix64(int(epoch) + 0xDA7A))


class EpochOrder:
    """Which row (an index into ``range(n)``) a seed picks: epochs without repeats within one."""

    def __init__(self, n: int, *, shuffle: bool = True, shuffle_seed: int = 0, cache: int = 8) -> None:
        self.n = int(n)
        self.shuffle = shuffle
        self.shuffle_seed = int(shuffle_seed)
        self._perms: dict[int, KeyedPermutation] = {}
        self._cache = cache
        self._lock = threading.Lock()

    def __call__(self, seed: int) -> int:
        if seed < 0:
            raise ValueError(f"a dataset seed must be >= 0, got {seed}")
        epoch, pos = divmod(int(seed), self.n)
        if not self.shuffle:
            return pos
        with self._lock:
            perm = self._perms.get(epoch)
            if perm is None:
                perm = KeyedPermutation(self.n, epoch_key(self.shuffle_seed, epoch))
                if len(self._perms) >= self._cache:
                    self._perms.pop(next(iter(self._perms)))
                self._perms[epoch] = perm
        return perm(pos)
