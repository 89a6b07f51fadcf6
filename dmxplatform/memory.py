"""Give freed memory back to the system after a request that used a lot of it."""

from __future__ import annotations

import ctypes
import ctypes.util

_libc_name = ctypes.util.find_library("c")
_libc = ctypes.CDLL(_libc_name) if _libc_name else None
# glibc's; absent from musl and other C libraries, where freed memory is returned anyway or not
# at all, and there is nothing to ask.
_malloc_trim = getattr(_libc, "malloc_trim", None)


def release_memory() -> None:
    """Return the free parts of the C heap to the system (glibc's malloc_trim).

    glibc keeps what a process freed for its next allocations; after a request that parsed and
    tokenized megabytes, that is hundreds of MB no other request will use soon."""
    if _malloc_trim is not None:
        _malloc_trim(0)
