"""How many threads run each call of an executable: its most (``nthreads``), or one, by timing.

Spreading a model's kernels over threads pays when the threads share a cache and the kernels are
big enough; a small model on threads whose cache lines travel far (a virtual machine whose vCPUs
the host places in two core complexes, which moves them every few minutes) runs slower on two
threads than on one: ResNet-18 at 64x64 on a 2-vCPU AMD EPYC VM, 0.23 ms on 2 threads and 0.29 on
1 while the vCPUs share a complex, 0.45 and 0.29 while they do not. No count is right for every
model and every minute, so each executable measures: every call is timed (two clock reads), the
count not in use runs one call in ``probe_every`` (a period), and the count with the faster best
call over the last ``window`` periods runs the others: each period gives the probe's time and the
fastest call on the count in use (the fastest, since other threads on the same cores or a
descheduled thread only ever slow a call down; over the same periods for both counts, so a burst of
interference weighs on both alike). The probes cost at most 1/probe_every of the slower count's
extra time; a change of placement is followed within ``window`` periods.

The outputs do not depend on the count: every kernel splits its outputs among the threads, never
a sum (``tests/runtime/test_threads.py`` checks models bitwise on 1 and 2 threads).
"""
from __future__ import annotations

from collections import deque


class ThreadChoice:
    """The thread count of each call, between 1 and ``most`` (see the module docstring):
    ``n = choice.pick()`` before a call, ``choice.record(n, seconds)`` after it (a few hundred
    nanoseconds together)."""

    def __init__(self, most: int, probe_every: int = 32, window: int = 5):
        if most < 2:
            raise ValueError(f"a choice needs at least 2 threads, got {most}")
        self.most = most
        self.probe_every = probe_every
        self.times: dict[int, deque] = {most: deque(maxlen=window), 1: deque(maxlen=window)}
        self.using = most  # the count the calls run with, between probes
        self._measuring = True  # until both counts have ``window`` calls: they take turns
        self._left = 1  # calls until the next turn or probe
        self._best = _INF  # the fastest call on the count in use since the last probe

    def pick(self) -> int:
        """The thread count of the next call."""
        self._left -= 1
        if self._left > 0:
            return self.using
        if self._measuring:
            self._left = 1
            return min(self.times, key=lambda n: len(self.times[n]))
        self._left = self.probe_every
        return 1 if self.using == self.most else self.most

    def record(self, count: int, seconds: float) -> None:
        """A call on ``count`` threads took ``seconds``."""
        if count == self.using and not self._measuring:  # between probes: the period's fastest
            if seconds < self._best:
                self._best = seconds
            return
        times = self.times.get(count)
        if times is None:
            return
        times.append(seconds)
        if not self._measuring:  # a probe ends a period: its fastest call on the count in use
            self.times[self.using].append(self._best)
            self._best = _INF
        most, one = self.times[self.most], self.times[1]
        if len(most) == most.maxlen and len(one) == one.maxlen:
            self.using = 1 if min(one) < min(most) else self.most
            if self._measuring:
                self._measuring, self._left = False, self.probe_every


_INF = float("inf")


__all__ = ["ThreadChoice"]
