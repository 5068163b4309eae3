"""How a load test says that something went wrong, in one vocabulary.

A request that fails is not an exception: it is recorded as an error *kind*, a short string that
the sender writes and the statistics count (an HTTP status such as "503", or one of the names
below). Load shed by a healthy server is told apart from real failures here, once. A target that
cannot be load-tested at all is the one exception: `TargetError`. The command's exit statuses
are the same vocabulary at the level of a whole run, so they are defined here too.
"""

from __future__ import annotations

from typing import Final

SHED_KINDS: Final = frozenset({"503", "429"})
"""Statuses a healthy server answers with when it sheds load: expected under overload, so the
report counts them apart from failures."""
DROPPED_CLIENT: Final = "dropped_client"
TIMEOUT: Final = "timeout"
CONNECTION: Final = "connection"
UNFINISHED: Final = "unfinished"
"""A request still outstanding when the run stopped (hard time cap, or a probe stopped early)."""
INVALID_RESPONSE: Final = "invalid_response"


EXIT_OK: Final = 0
"""A run or search completed and is a result (server errors, shed load included, are in it)."""
EXIT_USAGE: Final = 2
"""Bad arguments, or a target that cannot be load-tested."""
EXIT_INVALID: Final = 3
"""The run completed but is not a result: an open loop whose client fell behind its schedule
or dropped arrivals, or a find-max search stopped by such a probe. The report says why."""
EXIT_INTERRUPTED: Final = 130


class TargetError(Exception):
    """The target cannot be load-tested: unreachable, unknown model, or metadata we can't use."""
