"""What every service shares: the request limits, an action's result, the caches that let a room of pages
watch one run for the price of one."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

from grpo_app.core.env import env_int
from grpo_app.runs.manager import RunManager
from grpo_app.runs.monitor import current_view


@dataclass
class Limits:
    """What one request may ask of this server (environment variables override the defaults)."""

    max_upload_mb: int = field(default_factory=lambda: env_int("GRPO_APP_MAX_UPLOAD_MB", 5, 1, 20))
    max_eval_n: int = field(default_factory=lambda: env_int("GRPO_APP_MAX_EVAL_N", 500, 1, 5000))
    max_eval_tokens: int = 1024
    max_pass_k: int = field(default_factory=lambda: env_int("GRPO_APP_MAX_PASS_K", 16, 1, 64))
    max_try_tokens: int = 512
    eval_pending: int = field(default_factory=lambda: env_int("GRPO_APP_EVAL_QUEUE", 3, 1, 50))
    eval_idle_s: float = 90.0


@dataclass
class Result:
    """What an action tells the page: ok or not, a message, and messages per form control."""

    ok: bool
    message: str
    errors: dict = field(default_factory=dict)
    run_id: str | None = None


class ViewCache:
    """`monitor.current_view`, recomputed at most every `ttl` seconds for all pages together."""

    def __init__(self, manager: RunManager, ttl: float = 0.5):
        self.manager, self.ttl = manager, ttl
        self._lock = threading.Lock()
        self._view: dict | None = None
        self._at = 0.0

    def get(self) -> dict:
        with self._lock:
            now = time.monotonic()
            if self._view is None or now - self._at >= self.ttl:
                self._view = current_view(self.manager)
                self._at = now
            return self._view

    def invalidate(self) -> None:
        with self._lock:
            self._view = None


class FigureCache:
    """Plotly JSON per (what it shows, version); built once, served to every page."""

    def __init__(self, size: int = 24):
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._build = threading.Lock()
        self.size = size
        self.builds = 0

    def get(self, key, build):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        with self._build:  # one builder at a time: twenty pages asking at once build it once
            with self._lock:
                if key in self._items:
                    return self._items[key]
            value = build()
            self.builds += 1
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            return value


TRAIN_CHARTS = ("reward", "loss", "length", "memory", "throughput")
MEMORY_BUILD_S = 5.0  # a live run's memory chart is rebuilt at most this often for all pages (see chart_json)


class Service:
    """One tab's actions. The shared state (the manager, limits, caches, the evaluation queue, Try's models)
    belongs to the `Studio` shell and is reached through it, so every tab sees the same."""

    def __init__(self, studio):
        self.studio = studio

    manager = property(lambda self: self.studio.manager)
    limits = property(lambda self: self.studio.limits)
    views = property(lambda self: self.studio.views)
    figures = property(lambda self: self.studio.figures)
    answers = property(lambda self: self.studio.answers)
    evals = property(lambda self: self.studio.evals)
    models = property(lambda self: self.studio.models)
    presets = property(lambda self: self.studio.presets)
    uploads_dir = property(lambda self: self.studio.uploads_dir)


def _md(text: str) -> str:
    return "".join("\\" + c if c in "\\`*_{}[]<>()#+-.!|" else c for c in str(text))
