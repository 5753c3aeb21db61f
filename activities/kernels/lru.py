"""A small thread-safe LRU for what a worker process computes once per task: the reference's outputs (verifier),
its traced analysis (reference) and a candidate's GPU compile check (verifier). Each is a function of the sources it
is keyed by, so one run per worker process is enough; activities run in a thread pool, hence the lock."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class LRU(Generic[T]):
    def __init__(self, size: int = 32):
        self._size = size
        self._data: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> T | None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            return None

    def put(self, key: str, value: T) -> None:
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._size:
                self._data.popitem(last=False)
