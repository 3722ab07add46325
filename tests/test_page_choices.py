"""The step view's choices per page (ui/choices.py): a per-step draw that left the page before the user moved a
What-if slider must not put the old weight back (CI failure of 2026-11-24, test_browser_views). In-process: the
app's own event functions called in the order the browser's answers can arrive, no browser."""

import json
import re

from grpo_app.core.config import load_config
from grpo_app.core.rewards import REWARD_FUNCS
from grpo_app.core.run_folder import RunDir
from grpo_app.ui import app as ui_app
from grpo_app.ui.choices import PageChoices

NAMES = list(REWARD_FUNCS)
N = len(NAMES)  # the What-if box: run id, one slider per reward, group size, the table
STEP = {
    "step": 3,
    "stage": 0,
    "weights": {"correctness": 1.0, "brevity": 1.0},
    "groups": [
        {
            "question": "What is 2 + 3?",
            "answer": "5",
            "completions": ["a", "b", "c", "d"],
            "rewards": {"correctness": [0.0, 0.0, 0.0, 0.0], "brevity": [1.0, 0.5, 0.0, 1.0]},
            "totals": [1.0, 0.5, 0.0, 1.0],
            "advantages": [0.78, -0.26, -1.31, 0.78],
        }
    ],
}


def weights(**w) -> list[float]:
    return [float(w.get(n, 0.0)) for n in NAMES]


def advantages(html: str) -> list[str]:
    return re.findall(r'class="num adv wi-adv"[^>]*>([^<]+)<', html)


def version(html: str) -> int:
    return int(re.search(r'data-wiv="(\d+)"', html).group(1))


def test_choices_are_per_page_versioned_and_bounded():
    c = PageChoices(limit=2)
    assert c.get("a") == {} and c.get(None) == {}
    assert c.remember(None, group=1) == 0  # a request without a page id is not remembered
    assert len(c) == 0
    assert c.remember("a", group=1) == 1
    assert c.remember("a", size=4) == 2
    assert c.get("a") == {"group": 1, "size": 4, "version": 2}
    c.remember("b", group=0)
    c.get("a")  # a page that asks stays; the least recently used one goes
    c.remember("c", group=2)
    assert c.get("b") == {} and c.get("a")["group"] == 1 and c.get("c")["version"] == 1


def test_a_draw_sent_before_a_slider_moved_keeps_the_move(tmp_path):
    root = tmp_path / "runs"
    run = RunDir.create(root, load_config("quick"))
    run.step_path.write_text(json.dumps(STEP))
    demo = ui_app.build_app(runs_dir=root, configs_dir="tests/configs/app", default_preset="tiny-app")
    fns = {bf.api_name or getattr(bf.fn, "__name__", ""): bf.fn for bf in demo.fns.values() if bf.fn}
    on_change, pick = fns["on_change"], fns["step_group"]

    def draw(page, group, applied, size, *w):  # the page's draw route (ui/live.py): its own outputs
        return demo.live.draw(page, group, applied, size, list(w))[1]

    page, other = "page-1", "page-2"  # the pages' own ids
    run_w, no_brevity = weights(correctness=1, brevity=1), weights(correctness=1)

    box = draw(page, 0, None, 8, *weights())[-(N + 3):]  # a new page: the run's weights, the whole group
    assert box[0] == run.id and [u["value"] for u in box[1 : N + 1]] == run_w and box[N + 1]["value"] == 4
    assert advantages(box[N + 2]) == ["+0.78", "-0.26", "-1.31", "+0.78"]  # the recorded ones

    assert advantages(on_change(page, 0, 4, *no_brevity)) == ["+0.00"] * 4  # the user turns brevity off
    # ... while a draw that left the page with brevity on is answered: it keeps brevity off
    box = draw(page, 0, run.id, 4, *run_w)[-(N + 3):]
    assert box[1 : N + 1] == no_brevity and advantages(box[N + 2]) == ["+0.00"] * 4
    # another page has its own choices
    assert draw(other, 0, run.id, 4, *run_w)[-(N + 3):][1 : N + 1] == run_w

    # each table carries the version of the choices it was computed from, so the page can keep a newer one
    late = draw(page, 0, run.id, 4, *run_w)[-1]  # computed now, answered later
    fresh = on_change(page, 0, 4, *run_w)  # the user puts brevity back; this answer lands first
    assert version(fresh) == version(late) + 1 and advantages(late) == ["+0.00"] * 4
    assert version(draw(page, 0, run.id, 4, *run_w)[-1]) == version(fresh)  # a draw after it: the same choices
    assert version(draw("", 0, run.id, 4, *run_w)[-1]) == 0  # a page without an id

    # the group size and the prompt are kept the same way
    on_change(page, 0, 2, *run_w)
    pick(page, 0)
    box = draw(page, 0, run.id, 4, *run_w)[-(N + 3):]
    assert box[N + 1] == 2 and advantages(box[N + 2]) == ["+0.71", "-0.71"]


def test_a_late_run_list_refresh_keeps_the_run_picked_meanwhile(tmp_path):
    """A tab click (or a page load) asks for the run lists with the values the page had then; under load the
    answer can land after the user picked another run (CI failure of 2026-11-29, test_browser's stage x task
    matrix drawn without its second run). A value that is still a run is left to the page; only a gone one is
    replaced."""
    import time

    root = tmp_path / "runs"
    runs = []
    for _ in range(2):
        run = RunDir.create(root, load_config("quick"))
        run.final_dir.mkdir(parents=True)
        (run.final_dir / "config.json").write_text("{}")
        runs.append(run.id)
        time.sleep(1.1)  # run ids are per second
    older, newest = runs
    demo = ui_app.build_app(runs_dir=root, configs_dir="tests/configs/app", default_preset="tiny-app")

    def refresh_of(*elem_ids):
        for bf in demo.fns.values():
            if getattr(bf.fn, "__name__", "") == "refresh" and [getattr(c, "elem_id", None) for c in bf.outputs][: len(elem_ids)] == list(elem_ids):
                return bf.fn
        raise AssertionError(f"no refresh writes {elem_ids}")

    compare = refresh_of("compare-run", "matrix-other")
    run_u, other_u = compare(None, "")  # a new page: no run yet, nothing beside it
    assert run_u["value"] == newest and "value" not in other_u and other_u["choices"] == ["", newest, older]
    run_u, other_u = compare(newest, "")  # asked at a tab click; the user picks runs before it lands
    assert "value" not in run_u and "value" not in other_u and run_u["choices"] == [newest, older]
    run_u, other_u = compare("gone-run", "gone-too")  # deleted meanwhile: replaced
    assert run_u["value"] == newest and other_u["value"] == ""

    try_run = refresh_of("try-run")
    assert "value" not in try_run(older) and try_run(None)["value"] == newest
    runs_tab = refresh_of("runs-table", "runs-pick")
    assert "value" not in runs_tab(older)[1] and runs_tab("gone-run")[1]["value"] == newest
