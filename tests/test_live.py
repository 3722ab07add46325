"""The Train tab's live view as plain routes (ui/live.py): what a page's tick and draws fetch instead of Gradio
events. In-process server on a free port, the tests' tiny app presets; no browser (tests/test_browser_pacing.py
drives a real page through them)."""

import json

import httpx
import pytest

from grpo_app.ui import app as ui_app
from grpo_app.ui.live import page_of
from tests.app_server import free_port


def serve(tmp_path, **launch):
    demo = ui_app.build_app(runs_dir=tmp_path / "runs", configs_dir="tests/configs/app", default_preset="tiny-app")
    port = free_port()
    demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **launch)
    return demo, f"http://127.0.0.1:{port}/grpo_app"


@pytest.fixture
def served(tmp_path):
    demo, url = serve(tmp_path)
    yield demo, url
    demo.close()


def test_the_routes_answer_a_page_without_a_run(served):
    demo, url = served
    poll = httpx.get(f"{url}/poll", params={"page": "p1"}).json()
    assert len(poll) == 4 and "no run yet" in poll[0] and poll[3] == 1.5
    drawn = httpx.get(f"{url}/draw", params={"page": "p1"}).json()
    # 4 step charts, the run log, the prompt picker (an update of its choices), the step view, the What-if box
    assert len(drawn) == 5 + 2 + 1 + demo.live.n_weights + 2
    assert all(d["type"] == "plotly" and json.loads(d["plot"])["data"] == [] for d in drawn[:4])
    assert drawn[5] == {"__type__": "update", "choices": [], "value": None}
    assert httpx.get(f"{url}/memory").json()[0]["type"] == "plotly"
    assert demo.live.served == {"poll": 1, "draw": 1, "memory": 1} and demo.pacer.polls == 1 and demo.pacer.draws == 2


def test_the_shared_part_of_a_draw_is_encoded_once_for_every_page(served, monkeypatch):
    demo, url = served
    calls = []
    real = demo.studio.train.events_md
    monkeypatch.setattr(demo.studio.train, "events_md", lambda view: calls.append(1) or real(view))
    bodies = {httpx.get(f"{url}/draw", params={"page": f"p{i}"}).content for i in range(5)}
    assert len(calls) == 1 and len(bodies) == 1  # five pages, one encoding, the same answer


@pytest.mark.parametrize(
    "params",
    [
        {"page": "../../etc/passwd", "group": "1e999", "size": "nan", "w": ["inf", "abc", "-1e308"]},
        {"page": "x" * 500, "group": "-5", "size": "1" * 100, "w": ["1"] * 500, "applied": "<script>"},
        {"group": "", "size": "", "w": "", "applied": "r" * 10_000},
    ],
)
def test_bad_values_from_a_page_are_bounded_not_errors(served, params):
    demo, url = served
    r = httpx.get(f"{url}/draw", params=params)
    assert r.status_code == 200 and len(r.json()) == 5 + 2 + 1 + demo.live.n_weights + 2
    assert len(r.json()[7] or "") <= 200  # the run id the What-if box was set from: echoed back, bounded
    r = httpx.get(f"{url}/poll", params=params)
    assert r.status_code == 200 and len(r.json()) == 4
    assert demo.pacer.pages == 1  # an id that is not one counts as the anonymous page


def test_page_ids_are_short_plain_names():
    assert page_of("a1B2-_x") == "a1B2-_x"
    for bad in (None, "", "x" * 65, "../x", "a b", 5, "é"):
        assert page_of(bad) is None


def test_an_error_is_one_line_and_the_page_keeps_what_it_shows(served, monkeypatch, caplog):
    demo, url = served

    def broken():
        raise RuntimeError("the runs folder went away\nTraceback (most recent call last): secret")

    monkeypatch.setattr(demo.studio, "view", broken)
    r = httpx.get(f"{url}/poll", params={"page": "p1"})
    assert r.status_code == 500 and r.json() == {"error": "the runs folder went away"}
    assert "Traceback" not in r.text and "the live view's /grpo_app/poll failed" in caplog.text


def test_the_routes_ask_for_the_pages_login(tmp_path):
    demo, url = serve(tmp_path, auth=("teacher", "s3cret"))
    try:
        for route in ("poll", "draw", "memory"):
            r = httpx.get(f"{url}/{route}", params={"page": "p1"})
            assert r.status_code == 401 and "log in" in r.text
        assert demo.pacer.polls == 0 and demo.pacer.draws == 0  # nothing was counted or computed
        with httpx.Client() as c:
            root = url.rsplit("/grpo_app", 1)[0]
            assert c.post(f"{root}/login", data={"username": "teacher", "password": "wrong"}).status_code != 200
            assert c.get(f"{url}/poll", params={"page": "p1"}).status_code == 401
            assert c.post(f"{root}/login", data={"username": "teacher", "password": "s3cret"}).status_code == 200
            poll = c.get(f"{url}/poll", params={"page": "p1"})
            assert poll.status_code == 200 and len(poll.json()) == 4
    finally:
        demo.close()


def test_the_queue_polls_calmly_and_still_answers_queued_events(tmp_path):
    """Gradio's queue looks for new events every 1 ms while empty (~0.02-0.03 cores of a slow host with no page
    open, taken from the training); app.py makes it look every 20 ms. A queued event still runs."""
    from gradio_client import Client

    demo = ui_app.build_app(runs_dir=tmp_path / "runs", configs_dir="tests/configs/app", default_preset="tiny-app")
    assert not ui_app.calm_queue(object())  # a Gradio without these attributes: nothing set, no error
    port = free_port()
    demo.queue()
    assert demo._queue.sleep_when_free < ui_app.QUEUE_IDLE_POLL_S  # Gradio's own, on this platform
    assert ui_app.calm_queue(demo)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        assert demo._queue.sleep_when_free == ui_app.QUEUE_IDLE_POLL_S
        assert demo._queue.progress_update_sleep_when_free == ui_app.QUEUE_PROGRESS_POLL_S
        client = Client(f"http://127.0.0.1:{port}", verbose=False)
        preset = client.predict("tiny-app", api_name="/preset")  # a queued event
        assert preset and "tiny" in json.dumps(preset, default=str)
        client.close()
    finally:
        demo.close()
