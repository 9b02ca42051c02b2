"""A memory tier's bandwidth shared by all transfers in flight: weighted processor sharing on SimPy.

Every transfer in flight gets rate * weight / total_weight; a transfer of weight k stands for k identical blocks
moving bytes / k each, so a cohort of k blocks behaves exactly as k separate transfers would. Implemented with
virtual time: `_v` is the bytes served so far to one unit of weight; a transfer ends when `_v` reaches its
finish mark, and only the earliest finish needs a timer. A transfer's event succeeds once its bytes have moved
and its latency has passed, whichever is later: one event, where a timer and a condition would cost three.
"""
from __future__ import annotations

import heapq

import simpy


class SharedBandwidth:
    def __init__(self, env: simpy.Environment, bytes_per_s: float, latency_s: float, name: str,
                 record: bool = False):
        self.env, self.rate, self.latency, self.name = env, bytes_per_s, latency_s, name
        self._v = 0.0
        self._t = 0.0
        self._w = 0
        self._heap: list = []
        self._seq = 0
        self._gen = 0
        self.bytes = 0.0
        self.busy_s = 0.0
        self._busy_since: float | None = None
        self.intervals: list[tuple[float, float]] | None = [] if record else None

    def transfer(self, nbytes: float, weight: int = 1, waited_s: float = 0.0) -> simpy.Event:
        """An event that succeeds once `nbytes` (all `weight` members together) have moved and at least the
        latency has passed (less `waited_s`, for requests issued that long ago). The bytes take their
        share of bandwidth from the start: many requests in flight hide the latency (Little's law), so the tier is
        not idle while one transfer waits for its first bytes."""
        ev = self.env.event()
        if nbytes <= 0:
            ev.succeed()
            return ev
        self._start(nbytes, weight, ev, self.env.now + max(0.0, self.latency - waited_s))
        return ev

    def _start(self, nbytes: float, weight: int, ev: simpy.Event, ready: float) -> None:
        self._advance()
        if self._w == 0:
            self._busy_since = self.env.now
        self._seq += 1
        heapq.heappush(self._heap, (self._v + nbytes / weight, self._seq, ev, weight, ready))
        self._w += weight
        self.bytes += nbytes
        self._schedule()

    def _advance(self) -> None:
        now = self.env.now
        if self._w:
            self._v += (now - self._t) * self.rate / self._w
        self._t = now

    def _schedule(self) -> None:
        self._gen += 1
        if self._heap:
            dt = max(0.0, (self._heap[0][0] - self._v) * self._w / self.rate)
            gen = self._gen
            self.env.timeout(dt).callbacks.append(lambda _e: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:  # a later arrival or departure rescheduled
            return
        self._advance()
        # done when what is left would take less than the clock can resolve at this time (float rounding in
        # now - t can leave a few bytes short, and a shorter timer would not move the clock)
        tick = max(abs(self.env.now) * 1e-12, 1e-18)
        while self._heap and (self._heap[0][0] - self._v) * self._w / self.rate <= tick:
            _, _, ev, w, ready = heapq.heappop(self._heap)
            self._w -= w
            if ready - self.env.now > tick:   # its bytes have moved, its latency not yet passed
                self.env.timeout(ready - self.env.now).callbacks.append(lambda _e, ev=ev: ev.succeed())
            else:
                ev.succeed()
        if not self._heap:
            self._w = 0
            self._end_busy()
        self._schedule()

    def _end_busy(self) -> None:
        if self._busy_since is not None:
            self.busy_s += self.env.now - self._busy_since
            if self.intervals is not None:
                self.intervals.append((self._busy_since, self.env.now))
            self._busy_since = None
