"""What differs between the Pythons nftrec runs on (3.9 to 3.13), in one place: the newer
spelling where it exists, an equivalent for the older ones. Nothing here changes what
nftrec does on a Python that has the newer spelling."""

from __future__ import annotations

import sys

# dataclass(slots=True) is Python 3.10's; on 3.9 such a class keeps a __dict__ (same
# behaviour, more memory per instance). `@dataclass(eq=False, **SLOTS)`.
SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}


if sys.version_info >= (3, 11):
    async def within(seconds: float, coro) -> None:
        """Await `coro`, cancelled after `seconds` with asyncio.TimeoutError (asyncio is
        imported here, not by every user of this module)."""
        import asyncio

        async with asyncio.timeout(seconds):
            await coro
else:  # asyncio.timeout is Python 3.11's; wait_for runs the coroutine as a task of its own
    async def within(seconds: float, coro) -> None:
        import asyncio

        await asyncio.wait_for(coro, seconds)
