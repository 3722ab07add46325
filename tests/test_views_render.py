"""HTML of the what-if and answers-across-training views: content, clamping, escaping (no Gradio needed)."""

from grpo_app.training.advantages import what_if
from grpo_app.ui import render

GROUP = {
    "problem_id": "arith-1-0",
    "question": "What is <b>2</b> + 2?",
    "answer": "4",
    "completions": ["<script>alert(1)</script> #### 4", "#### 5", "four", "#### 4"],
    "rewards": {"correctness": [1.0, 0.0, 0.0, 1.0]},
    "totals": [1.0, 0.0, 0.0, 1.0],
    "mean": 0.5,
    "std": 0.577,
    "advantages": [0.866, -0.866, -0.866, 0.866],
}
STEP = {"step": 7, "stage": 0, "stage_name": "s1", "weights": {"correctness": 1.0}, "groups": [GROUP]}


def test_what_if_html_shows_recorded_and_recomputed_advantages_escaped():
    res = what_if(GROUP, {"correctness": 1.0, "strict_format": 1.0}, group_size=3)
    html = render.what_if_html(STEP, 0, res)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert html.count('class="num adv wi-adv"') == 3  # three completions kept
    assert "+0.87" in html  # a recorded advantage
    assert "first <b>3</b> of 4" in html and "strict_format" in html and "Scored now from the text" in html
    assert "⚠" in render.what_if_html(STEP, 0, None, "group size must be between 1 and 4")
    assert "gs-empty" in render.what_if_html(None, 0, None)


def test_answers_problem_html_clamps_the_position_and_marks_it():
    hist = [
        {"step": s, "stage": 0, "stage_name": "s1", "weights": {"correctness": 1.0}, "group": GROUP} for s in (2, 5, 9)
    ]
    html = render.answers_problem_html(hist, 99)
    assert "sampled <b>3</b> times" in html and "Showing time <b>3</b> (step 9)" in html
    assert html.count('class="ans-now"') == 1 and "2/4" in html  # correctness paid 2 of 4
    assert "&lt;b&gt;2&lt;/b&gt;" in html and "<b>2</b> +" not in html
    assert "not sampled" in render.answers_problem_html([], 1)


def test_answers_step_html_and_choices():
    html = render.answers_step_html(STEP, 2, 5)
    assert "Recorded step 2 of 5" in html and "training step <b>7</b>" in html and html.count('class="gs"') == 1
    assert "No step recorded" in render.answers_step_html(None, 1, 0)
    choices = render.answers_choices([{"key": "arith-1-0", "question": "What is 2 + 2?", "steps": [1, 4]}])
    assert choices[0][1] == "" and choices[1] == ("arith-1-0 · sampled 2× · What is 2 + 2?", "arith-1-0")
