"""Bounds on a request's head (its request line and headers) as its bytes arrive, before
the HTTP parser sees them: so many bytes and so many header lines, beyond which the
connection gets a 431 (``connections.py``).

Checked ahead of the parser because the parser keeps a header line it has not seen the
end of, growing it piece by piece at a cost that grows with its length: one connection
streaming a single endless header line held the event loop for seconds. The head ends at
its first empty line (``\\r\\n\\r\\n``); empty lines before a request line are skipped, as
the parser skips them.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_HEADER_BYTES = 32 * 1024
DEFAULT_MAX_HEADERS = 100
_END = b"\r\n\r\n"


@dataclass(frozen=True)
class HeadLimits:
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES  # request line and headers together
    max_headers: int = DEFAULT_MAX_HEADERS

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")


DEFAULT_HEAD_LIMITS = HeadLimits()


class RequestHead:
    """Counts one request's head as its bytes arrive (``feed``), until it ends; ``reset``
    for the connection's next request."""

    def __init__(self, limits: HeadLimits) -> None:
        self.limits = limits
        self.reset()

    def reset(self) -> None:
        self.ended = False
        self.size = 0
        self.lines = 0  # line ends seen, that of the request line included
        self._tail = b""  # the last bytes fed, where an end may begin

    def feed(self, data: bytes) -> str | None:
        """Count ``data``; why the head is over its bounds, or None."""
        if self.ended:
            return None
        if not self.size:
            data = data.lstrip(b"\r\n")
        window = self._tail + data
        end = window.find(_END)
        head = window if end < 0 else window[: end + len(_END)]
        self.size += len(head) - len(self._tail)
        self.lines += head.count(b"\n") - self._tail.count(b"\n")
        self._tail = window[-(len(_END) - 1) :]
        self.ended = end >= 0
        headers = self.lines - 1 - self.ended  # less the request line and the empty line
        if self.size > self.limits.max_header_bytes:
            return f"the request's headers exceed {self.limits.max_header_bytes} bytes"
        if headers > self.limits.max_headers:
            return f"the request has more than {self.limits.max_headers} headers"
        return None
