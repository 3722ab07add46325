"""What each page last chose in the Train tab's step view (the prompt, the What-if weights and group size), kept
on the server by page (the page's random id, ui/live.py).

Why the server keeps them: a new step reaches a page as one request (`/draw`) that redraws the prompt picker
and the What-if box along with the charts. That request carries the page's values at the moment the step
arrived. If the user moves a slider while it is in flight, the slider's own answer can come back first and the
draw's answer second, putting the old weight back on the slider and the old advantages in the table (seen in CI
on 2026-11-24: brevity set to 0, then back to 1 by a draw sent a moment earlier). So every handler that takes a
choice from the page writes it here first, and the draw uses what is here, not what it was sent, re-reading when
a choice arrived while it was computing (`version`).

That leaves one order: the draw reads the choices, a slider's answer is computed from the newer ones and reaches
the page first, then the draw's answer lands (its charts take longer to send). So every What-if table carries the
version it was computed from (`render.stamp_what_if`), and the page keeps its What-if box when a draw's answer is
older than the box it shows (ui/live.py, DRAW_JS). CI failure of 2026-12-03: brevity set to 0, and 60 s later the
table of brevity 1 still shown, most likely put back by the draw the run's end sets off (the run's charts move from
the live snapshot to the run folder); test_browser_views holds a draw to make that order certain.

Bounded: the least recently used of more than `limit` pages is forgotten (that page then falls back to what it
sends, which is right unless it is racing a slider).
"""

from __future__ import annotations

import collections
import threading


class PageChoices:
    def __init__(self, limit: int = 1024):
        self.limit = limit
        self._lock = threading.Lock()
        self._pages: collections.OrderedDict[str, dict] = collections.OrderedDict()

    def remember(self, page: str | None, **choice) -> int:
        """Record the page's latest choices (any of: run_id, group, size, weights), bump its version and return it
        (0 for a request without a page id, which is not remembered)."""
        if not page:
            return 0
        with self._lock:
            entry = self._pages.pop(page, None) or {"version": 0}
            entry.update(choice)
            entry["version"] += 1
            self._pages[page] = entry
            while len(self._pages) > self.limit:
                self._pages.popitem(last=False)
            return entry["version"]

    def get(self, page: str | None) -> dict:
        """A copy of the page's choices ({} for a page not seen); 'version' counts the times they changed."""
        if not page:
            return {}
        with self._lock:
            entry = self._pages.get(page)
            if entry is None:
                return {}
            self._pages.move_to_end(page)
            return dict(entry)

    def __len__(self) -> int:
        return len(self._pages)
