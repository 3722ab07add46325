"""How often each open page polls, so that a room of watchers cannot starve the server or the training.

Every page's Train tab polls the server with a gr.Timer. One page every 1.5 s costs nothing; a hundred
pages every 1.5 s are 67 requests a second, more than a 2-core server answers while it trains (about
15-20 a second were measured, `bench/watchers.py`): answers queue up, take seconds, and some connections
drop. So the server sets the period. It counts the pages that polled lately and tells each page, in the
answer to its poll (the gr.Timer's value: the browser restarts its timer with the new period), to poll
every `max(base_s, pages x (1 + draws per poll) / budget)` seconds, capped at `max_s`. A poll whose
answer shows a new step makes the page ask once more (`/draw`, and now and then `/memory_chart`); the
pacer hears of those draws (`drew`) and keeps a running mean of draws per poll, so all pages together
make about `budget` requests a second however many watch and however fast the steps come. With slow
steps (few draws) 30 pages poll about every 6-8 s at the default budget of 5 requests a second
(`GRPO_APP_POLL_BUDGET`); with steps faster than the period (a draw after nearly every poll) every
12-13 s; 100 pages every 20-30 s. A training step on 2 cores takes seconds to tens of seconds, and the
charts show every step whenever they are drawn, so nothing is lost but the step view's in-between steps.

Why the budget is small: each request costs the server CPU taken from the training's two cores (1-4 ms
since the page's requests are plain routes, ui/live.py; 4-16 ms as Gradio events before), and more than that
in training time, because the training's two threads meet at every parallel operation and a request that
takes one core for a few milliseconds holds up both. Measured with the Gradio events (bench/watchers.py,
docs/performance.md): 30 pages at ~11.5 requests a second slowed 3-s steps ~16%; before draws counted, a
poll budget of 10 slowed the training ~21% and 5 ~5% with 12-20 s steps.

A page counts as watching while it polled within the last `2 x period + 1` seconds (long enough to see
every page at the current period, so the count does not swing). A browser tab in the background stops
polling (gr.Timer ticks only while the tab is visible) and drops out of the count. The table of pages is
capped (`max_pages`): a script that makes up page ids only stretches the period, up to `max_s`.

The cap (`GRPO_APP_MAX_POLL_S`, default 30 s) is the other side of the trade: no page waits longer than that
for news, so past about 50 pages the budget is no longer kept (100 pages at 30 s make ~7-9 requests a second,
docs/performance.md). A larger class that cares more about the training's speed than about fresh pages can
raise it.
"""

from __future__ import annotations

import math
import os
import threading
import time

DEFAULT_BUDGET = 5.0  # requests per second (polls and the draws they lead to) for all pages together
MAX_PERIOD_S = 30.0  # the default cap of the period (GRPO_APP_MAX_POLL_S)
MAX_PERIOD_RANGE = (5.0, 300.0)


def budget_from_env() -> float:
    """GRPO_APP_POLL_BUDGET (requests per second for all pages together, polls and draws; default 5). A value
    that is not a positive number falls back to the default."""
    try:
        v = float(os.environ.get("GRPO_APP_POLL_BUDGET", DEFAULT_BUDGET))
    except ValueError:
        return DEFAULT_BUDGET
    return v if math.isfinite(v) and v > 0 else DEFAULT_BUDGET


def max_period_from_env() -> float:
    """GRPO_APP_MAX_POLL_S: the longest poll period in seconds (default 30, kept within 5-300). A value that is
    not a number falls back to the default."""
    try:
        v = float(os.environ.get("GRPO_APP_MAX_POLL_S", MAX_PERIOD_S))
    except ValueError:
        return MAX_PERIOD_S
    if not math.isfinite(v):
        return MAX_PERIOD_S
    return min(max(v, MAX_PERIOD_RANGE[0]), MAX_PERIOD_RANGE[1])


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
        self.draws = 0  # draws answered since the server started (`drew`)
        self._draws_pending = 0  # draws since the last poll
        self.draws_per_poll = 0.0  # running mean over about one round of every page's polls

    def drew(self) -> None:
        """Record a draw request (a page asking for a part whose marker changed)."""
        with self._lock:
            self.draws += 1
            self._draws_pending += 1

    def period(self, page: str | None, now: float | None = None) -> float:
        """Record a poll from `page` (the page's own id; None counts as one anonymous page) and return the period
        every page should poll at now, in seconds (rounded up to 0.5 s so small changes in the count do not
        restart every page's timer)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.polls += 1
            # the draws since the previous poll, folded into a mean over about one poll of every page; a page
            # draws at most twice per poll (step view, memory chart), so a script flooding /draw can at most
            # stretch the period (to 4x at the cap of 3), as made-up page ids can
            alpha = min(0.2, max(0.02, 1.0 / max(1, len(self._seen))))
            self.draws_per_poll += alpha * (min(self._draws_pending, 3) - self.draws_per_poll)
            self._draws_pending = 0
            seen = self._seen
            seen.pop(page or "", None)
            seen[page or ""] = now  # re-inserted: the dict stays ordered by last poll
            window = 2 * self._period + 1
            while seen:
                oldest, t = next(iter(seen.items()))
                if now - t <= window and len(seen) <= self.max_pages:
                    break
                del seen[oldest]
            wanted = max(self.base_s, len(seen) * (1.0 + self.draws_per_poll) / self.budget)
            self._period = min(self.max_s, math.ceil(wanted * 2) / 2)
            return self._period

    @property
    def pages(self) -> int:
        """Pages counted at the last poll."""
        return len(self._seen)
