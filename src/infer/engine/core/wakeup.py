"""Waking a blocked engine loop from another thread (a self-pipe).

A loop with nothing it can run blocks instead of spinning: on its command pipes in the
server's engine process, on this alone offline. What can make work runnable without a
command (a grammar that finished compiling in its worker thread) sets the wake-up; the
pipe's read end is a file descriptor the loop waits on beside the others.
"""

from __future__ import annotations

import contextlib
import os
import select
import weakref

# The longest a stalled loop waits without a wake-up before it looks again: a safety net,
# should work become runnable some way that does not set it.
STALL_CHECK_S = 1.0


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        weakref.finalize(self, _close, self._read, self._write)

    def fileno(self) -> int:
        """The end to wait on (readable once set)."""
        return self._read

    def set(self) -> None:
        """Wake the waiter (from any thread); a wake-up already pending is enough."""
        with contextlib.suppress(BlockingIOError):  # full of wake-ups not yet read
            os.write(self._write, b"\0")

    def clear(self) -> None:
        """Forget the pending wake-ups (before looking for runnable work again)."""
        with contextlib.suppress(BlockingIOError):  # none (left)
            while os.read(self._read, 4096):
                pass

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until set (or ``timeout_s``), then clear; returns whether it was set."""
        poller = select.poll()  # not select(): no limit on the descriptor's number
        poller.register(self._read, select.POLLIN)
        ready = poller.poll(None if timeout_s is None else timeout_s * 1000)
        self.clear()
        return bool(ready)


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
