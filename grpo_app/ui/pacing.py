"""How often each open page polls, so that a room of watchers cannot starve the server or the training.

Every page's Train tab polls the server with a gr.Timer. One page every 1.5 s costs nothing; a hundred
pages every 1.5 s are 67 requests a second, more than a 2-core server answers while it trains (about
15-20 a second were measured, `bench/watchers.py`): answers queue up, take seconds, and some connections
drop. So the server sets the period. It counts the pages that polled lately and tells each page, in the
answer to its poll (the gr.Timer's value: the browser restarts its timer with the new period), to poll
every `max(base_s, pages / budget)` seconds, capped at `max_s`. All pages together then ask about
`budget` times a second however many watch: 7 pages keep the 1.5 s period, 30 pages poll every 6 s and
100 pages every 20 s at the default budget of 5 polls a second (`GRPO_APP_POLL_BUDGET`). A training step
on 2 cores takes tens of seconds, so those periods still show every step. The budget is a trade: each
request costs the server 5-8 ms of CPU taken from the training's two cores, and each page also asks for
everything a new step changes once a step (one `/draw` request: charts, run log, step view, What-if); with
30 pages, a budget of 10 slowed the training ~21% and a budget of 5 ~5% (bench/watchers.py,
docs/performance.md; the host's own drift is of that size too).

A page counts as watching while it polled within the last `2 x period + 1` seconds (long enough to see
every page at the current period, so the count does not swing). A browser tab in the background stops
polling (gr.Timer ticks only while the tab is visible) and drops out of the count. The table of pages is
capped (`max_pages`): a script that makes up page ids only stretches the period, up to `max_s`.
"""

from __future__ import annotations

import math
import os
import threading
import time

DEFAULT_BUDGET = 5.0  # polls per second the server answers for all pages together
MAX_PERIOD_S = 30.0


def budget_from_env() -> float:
    """GRPO_APP_POLL_BUDGET (polls per second for all pages together; default 5). A value that is not a
    positive number falls back to the default."""
    try:
        v = float(os.environ.get("GRPO_APP_POLL_BUDGET", DEFAULT_BUDGET))
    except ValueError:
        return DEFAULT_BUDGET
    return v if math.isfinite(v) and v > 0 else DEFAULT_BUDGET


class PollPacer:
    """The poll period for each page: see the module docstring. Thread-safe; one per server."""

    def __init__(
        self, base_s: float = 1.5, budget: float = DEFAULT_BUDGET, max_s: float = MAX_PERIOD_S, max_pages: int = 5000
    ):
        if base_s <= 0 or budget <= 0 or max_s < base_s or max_pages < 1:
            raise ValueError("base_s and budget must be > 0, max_s >= base_s, max_pages >= 1")
        self.base_s, self.budget, self.max_s, self.max_pages = float(base_s), float(budget), float(max_s), max_pages
        self._seen: dict[str, float] = {}  # page id -> last poll time, oldest poll first
        self._period = self.base_s
        self._lock = threading.Lock()
        self.polls = 0  # polls answered since the server started

    def period(self, page: str | None, now: float | None = None) -> float:
        """Record a poll from `page` (a session id; None counts as one anonymous page) and return the period
        every page should poll at now, in seconds (rounded up to 0.5 s so small changes in the count do not
        restart every page's timer)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.polls += 1
            seen = self._seen
            seen.pop(page or "", None)
            seen[page or ""] = now  # re-inserted: the dict stays ordered by last poll
            window = 2 * self._period + 1
            while seen:
                oldest, t = next(iter(seen.items()))
                if now - t <= window and len(seen) <= self.max_pages:
                    break
                del seen[oldest]
            wanted = max(self.base_s, len(seen) / self.budget)
            self._period = min(self.max_s, math.ceil(wanted * 2) / 2)
            return self._period

    @property
    def pages(self) -> int:
        """Pages counted at the last poll."""
        return len(self._seen)
