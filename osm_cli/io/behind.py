"""`Behind`: a writer thread behind the caller, beside the other writers (save.py), for a long
--json document streamed as it is made (present/stream.py's pieces; cli.common.emit_json).

Leaves out: what is written (present/), where (the caller's write function).
"""

from __future__ import annotations

import contextlib
import queue
import threading


class Behind:
    """write(bytes) done by a thread behind the caller: the kernel's copy of a long document
    into a file overlaps the making of the next piece. Small writes are gathered into one, large
    ones made WRITE bytes at a time (on the machine benchmarks/bench_memory.py ran on, Linux
    6.18 and ext4, the kernel took 0.4-0.5 s to copy 1.6 GB into a file 64 or 128 KiB a write,
    1-3 s 1 MiB a write and 1.5-5 s 4 MiB a write); at most `depth` pieces wait; a failure to
    write is raised in the caller, at its next write or at close()."""

    SMALL = 1 << 16
    WRITE = 1 << 17

    def __init__(self, write, depth: int = 4):
        self._write, self._small = write, bytearray()
        self._queue: queue.Queue = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (piece := self._queue.get()) is not None:
            if self._error is None:
                try:
                    whole = memoryview(piece)
                    for at in range(0, len(whole), self.WRITE):
                        self._write(whole[at:at + self.WRITE])
                except BaseException as exc:  # raised again in the caller
                    self._error = exc

    def write(self, piece) -> None:
        if self._error is not None:
            raise self._error
        if len(piece) < self.SMALL:
            self._small += piece
            if len(self._small) < self.SMALL:
                return
            piece, self._small = bytes(self._small), bytearray()
        elif self._small:
            self._queue.put(bytes(self._small))
            self._small = bytearray()
        self._queue.put(piece)

    def abandon(self) -> None:
        """Stop without waiting: what is queued is dropped (the thread is a daemon)."""
        self._error = self._error or RuntimeError("abandoned")
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def close(self) -> None:
        if self._small:
            self._queue.put(bytes(self._small))
            self._small = bytearray()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


__all__ = ["Behind"]
