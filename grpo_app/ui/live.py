"""The Train tab's live view, answered outside Gradio's request pipeline.

Every open page asks the server, again and again while a run trains: a poll (the status line and two change
markers), and after each new step one draw (the step charts, the run log, the step view and the What-if box),
now and then the memory chart. Through Gradio each of those was an event request that cost the server
6-20 ms of CPU on a slow 2-core host (`bench/request_cost.py`: 2.4 / 6.6 / 2.0 ms on a fast one), nearly all
of it the framework's routing, pre- and post-processing; our own code is about 1% of it. That time comes out
of the training beside it, and with 100 pages it slowed the training by 40-60% on a slow host
(docs/performance.md, issue 18).

So these three requests are plain HTTP routes (`/grpo_app/poll`, `/grpo_app/draw`, `/grpo_app/memory`), and
the page's events that used to call the server are frontend-only events (`fn=None, js=...`): the event's
JavaScript fetches the route and returns the values of the event's outputs, which Gradio's frontend applies
as it would apply a server answer (plain values, or `{"__type__": "update", ...}` for the prompt picker's
choices and the sliders' range). What the page sees is unchanged; what the server does per request is only
our own code and one JSON encoding. The parts every page shares (the four charts and the run log) are encoded
once per change of the run, for all pages.

A page names itself with a random id (`page` in each request, kept in the hidden `page-id` box so the
What-if box's own Gradio events carry it too): the pacer counts pages by it (ui/pacing.py) and the page's
last choices are kept under it (ui/choices.py).

The routes ask for the same login as the page when the app has one, take only bounded numbers, and answer an
unexpected error with HTTP 500 and one line (logged with its traceback on the server); the page then keeps
what it shows and tries again at its next poll.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import re

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from grpo_app.core.fileio import hide_server_paths
from grpo_app.ui import render
from grpo_app.ui.choices import PageChoices
from grpo_app.ui.pacing import PollPacer
from grpo_app.ui.studio import FigureCache

log = logging.getLogger(__name__)

PREFIX = "/grpo_app"
PAGE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

MEMORY_EVERY_S = 5.0  # the memory chart's redraw on a page; when the server stretches the poll period, every
MEMORY_PERIODS = 6  # this many periods, since each redraw is a request from every page, rounded up to a rung of
MEMORY_LADDER_S = (5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 180.0)  # this ladder: the mark is a time bucket of that
# length, and a length that followed every small change of the period would move every page's mark at once


def memory_every(period: float, timer_s: float) -> float:
    """Seconds between memory-chart redraws for a page polling every `period` s (the tick's memory marker)."""
    if period <= timer_s:
        return MEMORY_EVERY_S
    wanted = max(MEMORY_EVERY_S, MEMORY_PERIODS * period)
    return next((s for s in MEMORY_LADDER_S if s >= wanted), MEMORY_LADDER_S[-1])


def group_index(value) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def page_of(value) -> str | None:
    """A page id as the page sent it, or None when it is not one (made-up ids only stretch the period)."""
    return value if isinstance(value, str) and PAGE_ID.match(value) else None


def _number(text, default: float | None = None, lo: float = 0.0, hi: float = 1e6) -> float | None:
    """A slider value from a query string, within [lo, hi]; `default` when it is not a finite number."""
    if text is None or len(text) > 32:
        return default
    try:
        v = float(text)
    except ValueError:
        return default
    return min(max(v, lo), hi) if math.isfinite(v) else default


class LiveView:
    """The three answers (`poll`, `draw`, `memory`) as Python values, and the routes that serve them.

    `sync` is the What-if box's `WhatIfBox.sync`; `n_weights` its number of reward sliders."""

    def __init__(self, studio, pacer: PollPacer, picked: PageChoices, sync, n_weights: int, steps_charts, timer_s):
        self.studio, self.pacer, self.picked, self.sync = studio, pacer, picked, sync
        self.n_weights, self.steps_charts, self.timer_s = n_weights, list(steps_charts), timer_s
        self._shared = FigureCache(size=2)  # charts_version -> the shared outputs' JSON
        self.served: collections.Counter = collections.Counter()  # answers given, by route name (tests, benches)

    # ---- answers ----------------------------------------------------------------------------------
    def poll(self, page: str | None) -> list:
        """[status line, step marker, memory marker, period]: what a page's tick shows and whether to draw."""
        studio = self.studio
        view = studio.view()
        step = view.get("latest_step") or {}
        period = self.pacer.period(page)
        return [
            studio.train.status_line(view),
            # once a step (and when the run log grows), not at every status update within it
            repr((view["charts_version"], step.get("step"), step.get("stage"))),
            studio.train.memory_mark(view, memory_every(period, self.timer_s)),
            period,
        ]

    def shared(self, view: dict) -> bytes:
        """The JSON of the draw's first outputs, the same for every page: the step charts and the run log,
        encoded once per change of the run (the figures and the log are themselves built once, by the studio)."""

        def encode() -> bytes:
            js = self.studio.train.chart_json(view, self.steps_charts)
            parts = [{"type": "plotly", "plot": js[k]} if js[k] is not None else None for k in self.steps_charts]
            return orjson.dumps([*parts, self.studio.train.events_md(view)])

        # a cache of its own: `encode` reads the studio's caches, whose builders do not nest
        return self._shared.get(view["charts_version"], encode)

    def draw(self, page: str | None, group, applied, size, weights: list) -> tuple[dict, list]:
        """One request per step: (the view drawn, the page's own outputs: the prompt picker, the step's table, and
        the What-if box recomputed for it). The prompt and the What-if values come from what the page last chose as
        the server heard it (`picked`), not from this request, which may have left the page before a slider moved
        (ui/choices.py); a choice that arrives while this computes makes it compute again."""
        self.pacer.drew()
        view = self.studio.view()
        step = view.get("latest_step")
        choices = render.group_choices(step)
        for _ in range(3):
            mine = self.picked.get(page)
            g = group_index(mine.get("group", group))
            g = g if g < len(choices) else 0
            box, chosen = self.sync(view, g, mine, applied, size, *weights)
            if self.picked.get(page).get("version") == mine.get("version"):
                break
        version = self.picked.remember(page, **chosen) if chosen else mine.get("version", 0)
        own = [
            {"__type__": "update", "choices": [[label, i] for label, i in choices], "value": g if choices else None},
            render.step_html(step, g),
            *box[:-1],
            render.stamp_what_if(box[-1], version),
        ]
        return view, own

    def memory(self) -> list:
        self.pacer.drew()
        js = self.studio.train.chart_json(self.studio.view(), ["memory"])["memory"]
        return [None if js is None else {"type": "plotly", "plot": js}]

    # ---- routes -----------------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        return [
            Route(f"{PREFIX}/poll", self._route("poll", self._poll), methods=["GET"]),
            Route(f"{PREFIX}/draw", self._route("draw", self._draw), methods=["GET"]),
            Route(f"{PREFIX}/memory", self._route("memory", self._memory), methods=["GET"]),
        ]

    def _poll(self, q) -> bytes:
        return orjson.dumps(self.poll(page_of(q.get("page"))))

    def _draw(self, q) -> bytes:
        applied = (q.get("applied") or "")[:200] or None  # a run id, echoed back to the page's hidden box
        weights = [_number(w, 0.0, 0.0, 1e3) for w in q.getlist("w")[: self.n_weights]]
        weights += [0.0] * (self.n_weights - len(weights))
        size = _number(q.get("size"), None, 0, 1e4)
        view, own = self.draw(page_of(q.get("page")), group_index(q.get("group")), applied, size, weights)
        shared = self.shared(view)
        return shared[:-1] + b"," + orjson.dumps(own)[1:]  # one JSON list: the shared outputs, then the page's own

    def _memory(self, q) -> bytes:
        return orjson.dumps(self.memory())

    def _route(self, name: str, answer):
        async def endpoint(request: Request) -> Response:
            if not await _logged_in(request):
                return Response(b'{"error": "log in first"}', status_code=401, media_type="application/json")
            try:
                body = await run_in_threadpool(answer, request.query_params)  # the view may read the run folder
            except Exception as e:  # noqa: BLE001 - one line to the page, the traceback to the server log
                log.exception("the live view's %s failed", request.url.path)
                text = hide_server_paths(str(e).strip().splitlines()[0])[:200] if str(e).strip() else type(e).__name__
                return Response(orjson.dumps({"error": text}), status_code=500, media_type="application/json")
            self.served[name] += 1
            return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

        return endpoint


async def _logged_in(request: Request) -> bool:
    """The page's own login: Gradio's session cookie (or its auth dependency) when the app asks for one."""
    app = request.app
    auth, dependency = getattr(app, "auth", None), getattr(app, "auth_dependency", None)
    if auth is None and dependency is None:
        return True
    if dependency is not None:
        user = dependency(request)
        if hasattr(user, "__await__"):
            user = await user
        return user is not None
    cookie = getattr(app, "cookie_id", "")
    token = request.cookies.get(f"access-token-{cookie}") or request.cookies.get(f"access-token-unsecure-{cookie}")
    return getattr(app, "tokens", {}).get(token) is not None


def serve_routes(demo, routes: list[Route]) -> None:
    """Make `demo.launch(...)` serve `routes` beside Gradio's own (as FastAPI's `routes`, ahead of Gradio's):
    Gradio builds its server app inside launch, so routes added to the Blocks before launch would be lost."""
    launch = demo.launch

    @functools.wraps(launch)
    def launch_with_routes(*args, **kwargs):
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        app_kwargs["routes"] = [*routes, *(app_kwargs.get("routes") or [])]
        return launch(*args, app_kwargs=app_kwargs, **kwargs)

    demo.launch = launch_with_routes


# ---- the page's side: frontend-only events (`fn=None, js=...`) ------------------------------------------
# Each returns the values of its event's outputs; an empty list leaves every output as it is (a failed request:
# the page keeps what it shows and asks again at its next poll).
_PRELUDE = """
  const base = String((window.gradio_config && window.gradio_config.root) || window.location.href);
  const at = (path) => new URL(path, base.endsWith("/") ? base : base + "/");
  const ask = async (path) => {
    try {
      const r = await fetch(at(path), {cache: "no-store", credentials: "same-origin"});
      return r.ok ? await r.json() : null;
    } catch (e) { return null; }
  };
  let page = window.__grpoPage || (typeof pid === "string" && /^[A-Za-z0-9_-]{1,64}$/.test(pid) ? pid : "");
  if (!page) {
    const a = new Uint8Array(12);
    crypto.getRandomValues(a);
    page = Array.from(a, (b) => b.toString(16).padStart(2, "0")).join("");
  }
  window.__grpoPage = page;
"""

POLL_JS = (
    "async (pid) => {"
    + _PRELUDE
    + """
  const a = await ask("grpo_app/poll?page=" + page);
  return Array.isArray(a) && a.length === 4 ? [...a, page] : [];
}"""
)

DRAW_JS = (
    "async (pid, group, applied, size, ...weights) => {"
    + _PRELUDE
    + """
  const q = new URLSearchParams({page: page, group: group ?? 0, applied: applied ?? "", size: size ?? ""});
  for (const w of weights) q.append("w", w ?? 0);
  const a = await ask("grpo_app/draw?" + q.toString());
  if (!Array.isArray(a)) return [];
  // the What-if box's outputs close the answer (its run id, a slider per weight, the size, the table); a table
  // computed from older choices than the one the page shows (a slider's answer landed first) leaves the box as is
  const version = (html) => { const m = /data-wiv="([0-9]+)"/.exec(String(html || "")); return m ? Number(m[1]) : -1; };
  const shown = document.querySelector("#what-if [data-wiv]");
  const box = weights.length + 3;
  if (shown && Number(shown.dataset.wiv) > version(a[a.length - 1])) {
    for (let i = a.length - box; i < a.length; i++) a[i] = {__type__: "update"};
  }
  return a;
}"""
)

MEMORY_JS = (
    "async (pid) => {"
    + _PRELUDE
    + """
  const a = await ask("grpo_app/memory");
  return Array.isArray(a) ? a : [];
}"""
)
