"""A test helper: run a function on several threads at once and collect what they raised."""
from __future__ import annotations

import threading
from typing import Callable


def run_threads(work: Callable[[int], None], count: int) -> list[BaseException]:
    """Call ``work(i)`` for ``i < count``, each on a thread of its own, all at once; return the
    exceptions they raised (a failed ``assert`` in ``work`` included), empty when none did."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 (returned to the test)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
