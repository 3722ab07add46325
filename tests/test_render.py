"""HTML renderers: what the page shows, with everything that came from a model, a file or a person escaped."""

import time

from grpo_app.ui import render

EVIL = '<script>alert("x")</script>'


def step_snapshot(std=0.5):
    return {
        "step": 7,
        "stage": 1,
        "stage_name": "three-terms",
        "weights": {"correctness": 1.0, "strict_format": 0.2},
        "groups": [
            {
                "question": f"What is 2+2? {EVIL}",
                "answer": "4",
                "completions": ["2+2=4\n#### 4", EVIL, "", "5"],
                "rewards": {"correctness": [1.0, 0.0, 0.0, 0.0], "strict_format": [1.0, 0.0, 0.0, 0.0]},
                "totals": [1.2, 0.0, 0.0, 0.0],
                "mean": 0.3,
                "std": std,
                "advantages": [1.5, -0.5, -0.5, -0.5],
            },
            {
                "question": "second prompt " * 10,
                "answer": "1",
                "completions": ["a", "b"],
                "rewards": {"correctness": [0, 0]},
                "totals": [0, 0],
                "mean": 0.0,
                "std": 0.0,
                "advantages": [0.0, 0.0],
            },
        ],
    }


def test_status_html_idle_and_running():
    assert "Start training" in render.status_html({})
    p = {
        "run_id": "20260101-run",
        "state": "running",
        "state_text": "running",
        "stage": 2,
        "n_stages": 3,
        "stage_name": "gsm8k",
        "step": 14,
        "total_steps": 30,
        "elapsed_s": 125,
        "eta_s": 200,
        "tokens_per_s": 321.4,
        "phase": "stage 2/3: gsm8k",
    }
    html = render.status_html(p)
    for part in (
        "20260101-run",
        "stage <b>2/3</b>",
        "step <b>14/30</b>",
        "elapsed <b>2:05</b>",
        "ETA <b>3:20</b>",
        "<b>321</b> tokens/s",
        'id="status-line"',
    ):
        assert part in html, part
    done = render.status_html({**p, "state": "completed", "error": EVIL})
    assert "ETA" not in done and "&lt;script&gt;" in done and "<script>" not in done


def test_step_html_shows_the_whole_group_with_advantages():
    html = render.step_html(step_snapshot())
    assert "Step <b>7</b>" in html and "stage 2" in html and "prompt 1 of 2" in html and "G = 4" in html
    assert html.count('<tr><td class="num">') == 4  # one row per completion
    assert "+1.50" in html and "-0.50" in html and "Gold answer: <b>4</b>" in html
    assert "× 0.20" in html  # the reward weights are shown in the header
    assert "group mean <b>0.300</b> · std <b>0.500</b>" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "(empty)" in html
    assert "rgba(0,158,115" in html and "rgba(213,94,0" in html  # green pushed up, red pushed down


def test_forced_hint_is_marked_where_completions_are_shown(capsys):
    """trainer.py, departure 8: a completion the trainer wrote "\\n####" into is marked, with its span, in the
    step view, What if and the CLI's `answers`; one that sampled every token is not."""
    from grpo_app.cli import _print_group

    step = step_snapshot()
    g = step["groups"][0]
    g["completions"][3] = f"5 {EVIL}\n#### 5"
    g["forced"] = [None, None, None, [len(f"5 {EVIL}"), len(f"5 {EVIL}\n####")]]
    for loss, words in (("train", "trained on like the model's own tokens"), ("mask", "left out of the loss")):
        html = render.step_html({**step, "forced_loss": loss})
        assert html.count("✎ hint</span>") == 1 and words in html
        assert '<mark class="forced"' in html and ">\n####</mark> 5" in html and "<script>" not in html
        assert "sampled; ✎ = a hint written in" in html
    plain = render.step_html(step_snapshot())
    assert "✎" not in plain and "Completion (sampled)" in plain
    result = {"weights": {"correctness": 1.0}, "rewards": {"correctness": [1, 0, 0, 0]}, "scale_rewards": "group",
              "group_size": 4, "completions": g["completions"], "totals": [1, 0, 0, 0], "advantages": [1.5, -0.5, -0.5, -0.5],
              "mean": 0.25, "std": 0.5}
    wi = render.what_if_html(step, 0, result)
    assert wi.count('class="forced-tag"') == 1 and "Scoring never forces" in wi
    _print_group({"step": 7, "stage": 1, "stage_name": "s", "group": g}, full=False)  # (one line per answer)
    out = capsys.readouterr().out
    assert "| ✎ 5 " in out and "✎[ ####] 5" in out and "1 completion(s) ended without" in out


def test_step_html_zero_std_explains_no_signal_and_clamps_group_index():
    html = render.step_html(step_snapshot(), group=9)  # out of range: the last group
    assert "prompt 2 of 2" in html and "no learning signal" in html
    assert "When training runs" in render.step_html(None)
    assert [c[1] for c in render.group_choices(step_snapshot())] == [0, 1]
    assert render.group_choices(step_snapshot())[1][0].endswith("…")


def test_events_md_lists_newest_first_and_escapes():
    t = time.time()
    events = [
        {
            "time": t,
            "event": "model_loaded",
            "model": "m",
            "parameters": 135e6,
            "trainable": 100e6,
            "device": "cpu",
            "threads": 2,
            "cpu": "CPU <b>X</b>",
            "cpu_kernels": "AVX2",
        },
        {
            "time": t + 1,
            "event": "stage_start",
            "stage": 0,
            "name": EVIL,
            "problems": 5,
            "origin": "[x](javascript:1)",
            "steps": 3,
            "ewc": False,
        },
        {"time": t + 2, "event": "step_ignored"},
        {"time": t + 3, "event": "stopped", "step": 2, "checkpoint": "checkpoint-2"},
    ]
    md = render.events_md(events)
    lines = [ln for ln in md.splitlines() if ln.startswith("- ")]
    assert len(lines) == 3 and "stopped at step 2" in lines[0] and "model loaded" in lines[2]
    assert "AVX2 kernels) with 2 threads" in lines[2] and "<b>" not in md
    assert "<script>" not in md and "\\[x\\]" in md
    assert "Nothing yet" in render.events_md([])


def compare_result():
    def rec(i, correct, pred):
        return {
            "id": str(i),
            "difficulty": 2,
            "question": f"q{i} {EVIL}",
            "gold": "4",
            "pred": pred,
            "correct": correct,
            "has_format": correct,
            "strict_correct": correct,
        }

    def summ(k, n):
        return {"n": n, "correct": k, "accuracy": k / n, "ci": (0.1, 0.9), "format_rate": 0.5, "strict_accuracy": 0.25}

    return {
        "base_label": "base <b>",
        "trained_label": "trained",
        "origin": "GSM8K test",
        "settings": {"seed": 3},
        "base": {
            "summary": summ(1, 4),
            "records": [rec(0, True, "4"), rec(1, False, None), rec(2, False, "3"), rec(3, False, "1")],
        },
        "trained": {
            "summary": summ(3, 4),
            "records": [rec(0, True, "4"), rec(1, True, "4"), rec(2, True, "4"), rec(3, False, "2")],
        },
        "paired": {"n": 4, "only_base": 0, "only_trained": 2, "both": 1, "neither": 1, "p_value": 0.5},
        "cached": True,
    }


def test_compare_summary_cards_and_paired_test():
    html = render.compare_summary_html(compare_result())
    assert "25.0%" in html and "75.0%" in html and "95% interval 10.0% – 90.0%" in html
    assert "only trained right <b>2</b>" in html and "p = 0.5" in html and "could well be chance" in html
    assert "loaded from cache" in html and "base &lt;b&gt;" in html
    strong = compare_result()
    strong["paired"]["p_value"] = 0.01
    assert "unlikely to be chance" in render.compare_summary_html(strong)


def test_compare_rows_side_by_side():
    rows = render.compare_rows(compare_result())
    assert len(rows) == 4 and len(rows[0]) == len(render.COMPARE_HEADERS)
    assert rows[1][4:] == ["(none)", "✗", "4", "✓"]


def test_job_progress_html_states():
    assert "position 2" in render.job_progress_html({"status": "queued", "progress": {}}, position=2)
    html = render.job_progress_html(
        {
            "status": "running",
            "progress": {
                "phase": "evaluating",
                "base_done": 5,
                "base_total": 10,
                "trained_done": 0,
                "trained_total": 10,
            },
        },
        busy_training=True,
    )
    assert "width:25.0%" in html and "base: 5/10" in html and "shares the CPU" in html
    assert "Failed: boom" in render.job_progress_html({"status": "failed", "error": "boom", "progress": {}})
    assert "Cancelled: gone" in render.job_progress_html(
        {"status": "cancelled", "cancel_reason": "gone", "progress": {}}
    )
    assert render.job_progress_html(None) == ""


def test_answer_html_streaming_and_final():
    assert "generating" in render.answer_html("Base", "m", {"text": "2+", "tokens": 2, "done": False})
    final = {"pred": "4", "how": "marker", "correct": True, "gold": "4", "rewards": {"correctness": 1.0, "total": 1.0}}
    html = render.answer_html(
        "Trained", "m", {"text": f"#### 4 {EVIL}", "tokens": 5, "done": True, "seconds": 1.2, "stop": "answer"}, final
    )
    assert "✓ correct" in html and "after '####'" in html and "stopped after its '####' line" in html
    assert "<script>" not in html and "weighted total" in html
    wrong = render.answer_html(
        "B", "m", {"text": "x", "done": True, "seconds": 1}, {**final, "correct": False, "gold": "5"}
    )
    assert "✗ expected 5" in wrong
    partial = render.answer_html("B", "m", {"text": "x", "done": True}, {**final, "correct": None, "partial": True})
    assert "left out" in partial


def test_run_rows_and_eval_rows():
    rows = render.run_rows(
        [
            {
                "run_id": "r1",
                "status": "completed",
                "preset": "quick",
                "model": "embedded",
                "stages": "a → b",
                "steps": "7/7",
                "final_reward": 0.4567,
                "duration_s": 95,
                "started": 1_700_000_000,
            }
        ]
    )
    assert rows[0][:7] == ["r1", "completed", "quick", "embedded", "a → b", "7/7", "0.457"] and rows[0][7] == "1:35"
    ev = render.eval_rows([("gsm8k-n4", compare_result()), ("broken", {"base": {}})])
    assert len(ev) == 1 and ev[0][0] == "gsm8k-n4" and ev[0][2].startswith("25.0%")


def test_system_md_table():
    info = {
        "cpu": {
            "name": "CPU X",
            "physical_cores": 2,
            "logical_cores": 4,
            "usable_cores": 2,
            "torch_threads": 2,
            "torch_interop_threads": 2,
            "load_1min": 0.5,
            "cuda": False,
        },
        "memory": {"total_mb": 8192, "available_mb": 4096, "process_rss_mb": 700},
        "versions": {"torch": "2.x", "gradio": "6.x"},
        "platform": "Linux",
        "embedded_model": {"name": "SmolLM2", "parameters": 134.5e6, "f32_mb": 513, "gguf_mb": 94},
    }
    md = render.system_md(
        info, [{"label": "tiny", "bytes": 12 * 2**20}], {"model": "m", "parameters": 3e6, "trainable": 1e5}
    )
    for part in (
        "2 physical, 4 logical",
        "8.0 GB total, 4.0 GB available",
        "134.5 M parameters",
        "torch 2.x",
        "Loaded for Try | tiny: 12 MB",
        "3.0 M parameters, 0.1 M trained",
    ):
        assert part in md, part


def test_run_details_md_tells_the_story_of_a_run():
    summary = {
        "run_id": "r9",
        "status": "failed",
        "steps": "3/7",
        "model": "embedded",
        "duration_s": 65,
        "error": "<oops>",
    }
    events = [
        {"event": "stage_start", "stage": 0, "name": "add", "problems": 64, "origin": "o", "steps": 4, "ewc": False},
        {"event": "fisher_done", "stage": 0, "samples": 16, "seconds": 3.2},
        {"event": "unknown"},
    ]
    md = render.run_details_md(summary, events)
    assert md.startswith("### r9") and "**duration** 1:05" in md and "&lt;oops&gt;" in md
    assert (
        "- stage 1 *add* started: 64 problems" in md
        and "- Fisher information of stage 1 estimated from 16 samples" in md
    )
    assert md.count("\n- ") == 2
    gpu = {**events[0], "device": "cuda", "precision": "bfloat16 autocast"}
    assert render.event_line(gpu).endswith("4 steps, cuda in bfloat16 autocast")
    assert render.event_line({**events[0], "device": "cpu", "precision": "float32"}).endswith("4 steps")
