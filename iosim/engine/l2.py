"""L2 as a cache of byte ranges: write-back, write-allocate, least recently used first out.

The cache holds disjoint intervals [lo, hi) of named tensors, each stamped with the time of its last access and
marked dirty when written. Ranges come from the plans' tiles (a K/V tile, a strip of S, ...), so residency is
tracked at tile granularity or finer. An access returns the bytes that hit, the bytes that missed, and the dirty
bytes it forced out to HBM. Eviction takes the least recently used interval first, from its low end. Where the
chip holds fewer dirty bytes than its capacity (`dirty_capacity`), the least recently written ones beyond it go
out to HBM as well and stay cached, clean.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections import Counter, deque


class L2Cache:
    def __init__(self, capacity_bytes: int, dirty_capacity: int | None = None):
        self.capacity = capacity_bytes
        self.dirty_capacity = dirty_capacity
        self.used = 0
        self.dirty = 0                                 # dirty bytes held
        self._dirty_lru: list = []                     # (stamp, tensor, lo) of intervals inserted dirty
        self._starts: dict[str, list[int]] = {}
        self._iv: dict[str, dict[int, list]] = {}    # tensor -> lo -> [hi, stamp, dirty]
        # least recently used first: (stamp, tensor, lo), stale entries skipped. Most entries come in ascending
        # order (a fresh stamp each access) and queue in `_fresh`; older stamps (the untouched ends of a split
        # interval) go to the heap `_lru`; the oldest of the two heads is next, as from one heap
        self._fresh: deque = deque()
        self._lru: list = []
        self._stamp = 0

    def access(self, tensor: str, lo: int, hi: int, write: bool) -> tuple[int, int, dict | None]:
        """Touch [lo, hi) of `tensor`. Returns (hit bytes, missed bytes, dirty bytes evicted per tensor or None)."""
        self._stamp += 1
        starts = self._starts.get(tensor)
        if starts is None:
            starts = self._starts[tensor] = []
            self._iv[tensor] = {}
        ivs = self._iv[tensor]
        same = ivs.get(lo)
        if same is not None and same[0] == hi:   # the same tile again: re-stamp it in place
            same[1] = self._stamp
            if write and not same[2]:
                self.dirty += hi - lo
            same[2] = same[2] or write
            self._fresh.append((self._stamp, tensor, lo))
            if same[2] and self.dirty_capacity is not None:
                heapq.heappush(self._dirty_lru, (self._stamp, tensor, lo))
                if self.dirty > self.dirty_capacity:
                    return hi - lo, 0, self._clean(None)
            return hi - lo, 0, None
        hit = 0
        dirty_inside: list[tuple[int, int]] = []
        k = bisect_right(starts, lo) - 1
        if k < 0 or ivs[starts[k]][0] <= lo:
            k += 1
        if k == len(starts) or starts[k] >= hi:   # nothing of it held (the common case of a streamed tile)
            starts.insert(k, lo)
            ivs[lo] = [hi, self._stamp, write]
            self.used += hi - lo
            self._fresh.append((self._stamp, tensor, lo))
            if write:
                self.dirty += hi - lo
                if self.dirty_capacity is not None:
                    heapq.heappush(self._dirty_lru, (self._stamp, tensor, lo))
            out = self._evict() if self.used > self.capacity else None
            if self.dirty_capacity is not None and self.dirty > self.dirty_capacity:
                out = self._clean(out)
            return 0, hi - lo, out
        # the intervals it overlaps, k .. j - 1, taken out at once (a long read over many small written tiles);
        # the parts of the first and last outside the access stay, as they were
        j = bisect_left(starts, hi, k)
        left = right = None
        for a in starts[k:j]:
            b, stamp, dirty = ivs.pop(a)
            a_in, b_in = max(a, lo), min(b, hi)
            hit += b_in - a_in
            self.used -= b - a
            if dirty:
                self.dirty -= b - a
                if dirty_inside and dirty_inside[-1][1] == a_in:   # touching dirty tiles: one interval
                    dirty_inside[-1] = (dirty_inside[-1][0], b_in)
                else:
                    dirty_inside.append((a_in, b_in))
            if a < lo:
                left = (a, stamp, dirty)
            if b > hi:
                right = (b, stamp, dirty)
        del starts[k:j]
        if left is not None:
            self._insert(tensor, left[0], lo, left[1], left[2])
        if right is not None:
            self._insert(tensor, hi, right[0], right[1], right[2])
        # the accessed range, newest; dirty where written now or dirty already
        stamp = self._stamp
        if write or not dirty_inside:
            self._insert(tensor, lo, hi, stamp, write)
        else:
            pos = lo
            for a, b in dirty_inside:
                if a > pos:
                    self._insert(tensor, pos, a, stamp, False)
                self._insert(tensor, a, b, stamp, True)
                pos = b
            if pos < hi:
                self._insert(tensor, pos, hi, stamp, False)
        out = self._evict() if self.used > self.capacity else None
        if self.dirty_capacity is not None and self.dirty > self.dirty_capacity:
            out = self._clean(out)
        return hit, (hi - lo) - hit, out

    def flush(self) -> Counter:
        """Write back every dirty byte (the end of a run); they stay cached, clean."""
        out: Counter = Counter()
        for tensor, ivs in self._iv.items():
            for a, iv in ivs.items():
                if iv[2]:
                    out[tensor] += iv[0] - a
                    iv[2] = False
        self.dirty = 0
        self._dirty_lru.clear()
        return out

    def clear(self) -> None:
        """Drop everything (after a flush: nothing dirty is lost)."""
        self.used = self.dirty = 0
        self._starts.clear()
        self._iv.clear()
        self._lru.clear()
        self._fresh.clear()
        self._dirty_lru.clear()

    # ---- internals -------------------------------------------------------------------------------------
    def _insert(self, tensor: str, a: int, b: int, stamp: int, dirty: bool) -> None:
        insort(self._starts[tensor], a)
        self._iv[tensor][a] = [b, stamp, dirty]
        self.used += b - a
        entry, fresh = (stamp, tensor, a), self._fresh
        if not fresh or entry > fresh[-1]:
            fresh.append(entry)
        else:
            heapq.heappush(self._lru, entry)
        if dirty:
            self.dirty += b - a
            if self.dirty_capacity is not None:
                heapq.heappush(self._dirty_lru, (stamp, tensor, a))

    def _remove(self, tensor: str, a: int) -> list:
        starts = self._starts[tensor]
        del starts[bisect_right(starts, a) - 1]
        iv = self._iv[tensor].pop(a)
        self.used -= iv[0] - a
        if iv[2]:
            self.dirty -= iv[0] - a
        return iv

    def _clean(self, out: dict | None) -> dict:
        """Write back the least recently written dirty bytes beyond the dirty capacity; they stay, clean."""
        out = out if out is not None else {}
        while self.dirty > self.dirty_capacity and self._dirty_lru:
            stamp, tensor, a = heapq.heappop(self._dirty_lru)
            iv = self._iv.get(tensor, {}).get(a)
            if iv is None or iv[1] != stamp or not iv[2]:
                continue  # stale: split, re-stamped, evicted or cleaned since
            b = iv[0]
            take = min(b - a, self.dirty - self.dirty_capacity)
            self._remove(tensor, a)
            self._insert(tensor, a, a + take, stamp, False)
            if take < b - a:
                self._insert(tensor, a + take, b, stamp, True)
            out[tensor] = out.get(tensor, 0) + take
        return out

    def _evict(self) -> dict | None:
        used, cap = self.used, self.capacity
        if used <= cap:
            return None
        # (the hottest loop of a full cache: totals kept locally, a whole interval taken out inline)
        out: dict = {}   # (a plain dict: made at nearly every access of a full cache, where a Counter costs more)
        fresh, lru, all_iv, all_starts = self._fresh, self._lru, self._iv, self._starts
        dirty_held = self.dirty
        while used > cap:
            stamp, tensor, a = heapq.heappop(lru) if lru and (not fresh or lru[0] < fresh[0]) else fresh.popleft()
            ivs = all_iv.get(tensor)
            iv = ivs.get(a) if ivs is not None else None
            if iv is None or iv[1] != stamp:
                continue  # stale entry: that interval was split, re-stamped or evicted
            b, _, dirty = iv
            starts = all_starts[tensor]
            k = bisect_left(starts, a)
            if used - cap < b - a:   # its low end out, the rest kept in place: still the oldest
                take = used - cap
                starts[k] = a + take
                del ivs[a]
                ivs[a + take] = iv
                entry = (stamp, tensor, a + take)
                if not fresh or entry <= fresh[0]:
                    fresh.appendleft(entry)
                else:
                    heapq.heappush(lru, entry)
                if dirty and self.dirty_capacity is not None:
                    heapq.heappush(self._dirty_lru, entry)
            else:
                take = b - a
                del starts[k]
                del ivs[a]
            used -= take
            if dirty:
                dirty_held -= take
                out[tensor] = out.get(tensor, 0) + take
        self.used, self.dirty = used, dirty_held
        return out or None
