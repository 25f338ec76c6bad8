"""The requests a front is running (the gRPC servicer, the HTTP app), for a graceful shutdown:
once draining starts new requests are refused; running ones are awaited, then cancelled."""
from __future__ import annotations

import threading


class RunningRequests:
    def __init__(self):
        self._closing = False
        self._active: set = set()  # the handles of the requests now running here
        self._idle = threading.Condition()  # guards `_active` (and a subclass's own sets)

    def start_draining(self) -> None:
        """New requests are refused from now on; running ones continue."""
        self._closing = True

    @property
    def draining(self) -> bool:
        return self._closing

    def active_count(self) -> int:
        with self._idle:
            return len(self._active)

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: not self._active, timeout=timeout)

    def cancel_all(self) -> int:
        with self._idle:
            handles = list(self._active)
        for handle in handles:
            handle.cancel()
        return len(handles)
