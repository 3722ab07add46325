"""The server sets each page's poll period so that all pages together poll about `budget` times a second
(ui/pacing.py), and the Train tab's tick sends that period as its timer's value."""

import pytest

from grpo_app.ui import app as ui_app
from grpo_app.ui.pacing import DEFAULT_BUDGET, PollPacer, budget_from_env


def settle(pacer: PollPacer, pages: int, rounds: int = 3, t0: float = 0.0) -> tuple[float, float]:
    """Every page polls once per period, as the browsers would, for a few periods; (period, last time)."""
    t, period = t0, pacer.base_s
    for _ in range(rounds):
        for i in range(pages):
            period = pacer.period(f"page-{i}", now=t + i * period / pages)
        t += period
    return period, t


def test_few_pages_keep_the_base_period():
    pacer = PollPacer(base_s=1.5, budget=10)
    assert settle(pacer, 1)[0] == 1.5
    assert settle(pacer, 15)[0] == 1.5  # 15 pages / 1.5 s = 10 polls/s: within the budget


@pytest.mark.parametrize("pages, period", [(30, 3.0), (100, 10.0), (101, 10.5), (1000, 30.0)])
def test_many_pages_poll_less_often_and_keep_the_budget(pages, period):
    pacer = PollPacer(base_s=1.5, budget=10, max_s=30)
    got, _ = settle(pacer, pages)
    assert got == period and pacer.pages == pages
    if period < 30:
        assert pages / got <= 10  # all pages together stay within the budget


def test_pages_that_stop_polling_drop_out_and_the_period_comes_back():
    pacer = PollPacer(base_s=1.5, budget=10)
    period, t = settle(pacer, 100)
    assert period == 10.0
    # 99 pages closed (or went to a background tab): the one left is alone after one window
    t += 2 * period + 2
    assert pacer.period("page-0", now=t) == 1.5 and pacer.pages == 1


def test_made_up_page_ids_are_capped_and_only_stretch_the_period():
    pacer = PollPacer(base_s=1.5, budget=10, max_s=30, max_pages=50)
    for i in range(10_000):  # a script inventing a new page id for every request
        p = pacer.period(f"fake-{i}", now=i * 0.001)
    assert pacer.pages == 50 and p == 5.0  # the table stays bounded
    assert pacer.period(None, now=11.0) <= 30  # an anonymous poll is answered too


def test_bad_settings_are_refused_and_the_env_budget_falls_back(monkeypatch):
    with pytest.raises(ValueError):
        PollPacer(base_s=0)
    with pytest.raises(ValueError):
        PollPacer(base_s=2, max_s=1)
    for bad in ("abc", "-3", "0", "nan", "inf"):
        monkeypatch.setenv("GRPO_APP_POLL_BUDGET", bad)
        assert budget_from_env() == DEFAULT_BUDGET
    monkeypatch.setenv("GRPO_APP_POLL_BUDGET", "2.5")
    assert budget_from_env() == 2.5


def test_the_tick_answers_with_the_period_as_the_timer_value(tmp_path, monkeypatch):
    """The Train tab's tick (a frontend event that fetches the live view's /poll, ui/live.py) has the gr.Timer
    among its outputs, in the place of the poll's last value, which the pacer fills with the page's id."""
    import gradio as gr

    from grpo_app.ui.live import POLL_JS

    monkeypatch.setenv("GRPO_APP_POLL_BUDGET", "1")
    demo = ui_app.build_app(runs_dir=tmp_path / "runs", configs_dir="tests/configs/app", default_preset="tiny-app")
    ticks = [fn for fn in demo.fns.values() if fn.js == POLL_JS]
    timer = next(b for b in demo.blocks.values() if isinstance(b, gr.Timer))
    assert ticks and all(fn.fn is None and fn.outputs[3] is timer for fn in ticks)  # the page's load, timer, Start...
    assert any(t[0] == timer._id and t[1] == "tick" for fn in ticks for t in fn.targets)

    every = []
    real_mark = demo.studio.train.memory_mark
    monkeypatch.setattr(demo.studio.train, "memory_mark", lambda view, every_s: every.append(every_s) or real_mark(view, every_s))
    periods = [demo.live.poll(f"s{i}")[-1] for i in range(6)]
    assert periods == [1.5, 2.0, 3.0, 4.0, 5.0, 6.0]  # budget 1 poll/s: N pages -> every N seconds
    # the memory chart: every 5 s, or 6 periods when paced, rounded up to a rung of the ladder
    assert every == [5.0, 15.0, 30.0, 30.0, 30.0, 60.0]


def test_the_period_cap_comes_from_the_env_and_reaches_the_tick_and_the_keep_alive(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from grpo_app.ui.pacing import MAX_PERIOD_S, max_period_from_env

    for raw, want in (("abc", MAX_PERIOD_S), ("nan", MAX_PERIOD_S), ("1", 5.0), ("60", 60.0), ("1e9", 300.0)):
        monkeypatch.setenv("GRPO_APP_MAX_POLL_S", raw)
        assert max_period_from_env() == want
    monkeypatch.setenv("GRPO_APP_MAX_POLL_S", "8")
    monkeypatch.setenv("GRPO_APP_POLL_BUDGET", "1")
    demo = ui_app.build_app(runs_dir=tmp_path / "runs", configs_dir="tests/configs/app", default_preset="tiny-app")
    periods = [demo.live.poll(f"s{i}")[-1] for i in range(12)]
    assert periods[:8] == [1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0] and set(periods[8:]) == {8.0}  # capped at 8 s
    # an idle connection outlives two of the longest periods
    demo.server = SimpleNamespace(config=SimpleNamespace(timeout_keep_alive=5))
    ui_app.keep_connections_alive(demo)
    assert demo.server.config.timeout_keep_alive == 2 * 8 + 15


def test_the_memory_mark_does_not_move_when_the_period_wobbles():
    """The memory marker is a time bucket of `memory_every` seconds: a length that followed every small change of
    the period (16.5, 17, 18 s as the draws-per-poll mean moves) gave a new bucket number, and every page redrew
    the memory chart at each change (measured: 1.85 draws per poll where 1.2 were due)."""
    from grpo_app.ui.live import memory_every
    from grpo_app.ui.services.train import TrainService

    lengths = {memory_every(p, 1.5) for p in (16.5, 17.0, 17.5, 18.0)}
    assert lengths == {120.0}
    view = {"live": True, "active": True, "run_id": "r", "mem_version": (1, 5)}
    marks = {TrainService.memory_mark(view, memory_every(p, 1.5)) for p in (16.5, 17.0, 18.0)}
    assert len(marks) == 1


def settle_drawing(pacer: PollPacer, pages: int, draws_per_poll: float, rounds: int = 6) -> tuple[float, float]:
    """As `settle`, each page's poll followed by its draws (every poll, or every other one for 0.5); returns
    (period, requests per second of all pages together at that period)."""
    t, period, owed = 0.0, pacer.base_s, 0.0
    for _ in range(rounds):
        for i in range(pages):
            period = pacer.period(f"page-{i}", now=t + i * period / pages)
            owed += draws_per_poll
            while owed >= 1:
                pacer.drew()
                owed -= 1
        t += period
    return period, pages * (1 + draws_per_poll) / period


@pytest.mark.parametrize("draws_per_poll", [0.0, 0.5, 1.0, 2.0])
def test_the_draws_count_against_the_budget_too(draws_per_poll):
    """A poll that shows a new step makes the page ask once more (`/draw`): with steps faster than the period,
    every poll is followed by a draw and the pages made twice the budget's requests before draws counted."""
    pacer = PollPacer(base_s=1.5, budget=5, max_s=30)
    period, rate = settle_drawing(pacer, 30, draws_per_poll)
    assert pacer.draws_per_poll == pytest.approx(draws_per_poll, abs=0.05)
    assert rate <= 5.0 * 1.05  # polls and draws together within the budget
    assert period == pytest.approx(30 * (1 + draws_per_poll) / 5, abs=0.6)  # and not slower than it needs


def test_a_flood_of_draws_only_stretches_the_period_to_a_bound():
    pacer = PollPacer(base_s=1.5, budget=5, max_s=100)
    for _ in range(50):
        for i in range(10):
            for _ in range(1000):
                pacer.drew()
            period = pacer.period(f"page-{i}", now=0.0)
    assert pacer.draws_per_poll <= 3 and period <= 10 * 4 / 5 + 0.5
