"""The real app (`python app.py` in a subprocess) driven through gradio_client, as a second browser
or a script would: start, refused second start, live status, stop, resume, compare, try, runs,
download, delete. Tiny random model; generous deadlines (the machine may be busy)."""

import json
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.app_server import app_server, stages, start_args, status, text_of, wait_for, wait_idle  # noqa: F401


@pytest.fixture(scope="module")
def client(app_server):  # noqa: F811
    return app_server.client()


def run_to_completion(client, **over) -> str:
    wait_idle(client)
    msg = client.predict(*start_args(**over), api_name="/start")[0]
    assert "Started run" in msg, msg
    run_id = msg.split("**")[1]
    wait_for(lambda: (s := status(client))["run_id"] == run_id and s["state"] == "completed", 300, what="completion")
    return run_id


def test_every_action_has_an_api_name(client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {
        "/start",
        "/stop",
        "/resume",
        "/status",
        "/compare",
        "/try",
        "/runs",
        "/delete",
        "/open_run",
        "/download",
        "/upload",
        "/preset",
        "/system",
        "/resume_run",
    } <= names


def test_preset_fills_the_form(client):
    out = client.predict("tiny-short", api_name="/preset")
    assert out[0].startswith("Tests only") and out[1] == "tiny-random"
    assert out[3]["data"] == [["s1", "arithmetic", 1, 1, 2, "", "", ""], ["s2", "arithmetic", 2, 2, 2, "", "", ""]]


def test_start_second_start_status_stop_resume(client, app_server):  # noqa: F811
    wait_idle(client)
    msg = client.predict(*start_args(run_name="live"), api_name="/start")[0]
    assert "Started run" in msg
    run_id = msg.split("**")[1]
    assert run_id.endswith("-live")

    refused = client.predict(*start_args(), api_name="/start")[0]
    assert "A run is in progress" in refused and run_id in refused  # the second Start (any browser) is refused

    st = wait_for(lambda: (s := status(client))["step"] >= 2 and s, 300, what="two steps")
    assert st["run_id"] == run_id and st["active"] and st["total_steps"] == 30 and st["n_stages"] == 2
    assert st["stage"] == 1 and st["tokens_per_s"] and st["elapsed_s"] > 0 and st["latest_step_groups"] == 2

    # what a page's timer gets (a plain route, not a Gradio event: ui/live.py): the status line and two change
    # markers; a changed step marker makes the page ask for everything a step changes in one request: the step
    # charts with the recorded steps, the run log, the latest GRPO step and the What-if box for it; the memory
    # chart has its own marker
    live = f"{app_server.url}/grpo_app"
    poll = httpx.get(f"{live}/poll?page=api-test").json()
    status_html, step_mark = poll[0], poll[1]
    assert len(poll) == 4 and run_id in status_html and "step <b>" in status_html and run_id in step_mark
    drawn = httpx.get(f"{live}/draw", params={"page": "api-test", "group": 0, "size": 2}).json()
    reward = json.loads(drawn[0]["plot"])
    steps = reward["data"][0]["x"]
    assert len(steps) >= 2 and steps == sorted(steps) and reward["layout"]["uirevision"] == run_id
    assert "Run log" in drawn[4]
    picker, step_view, what_if_box = drawn[5], drawn[6], drawn[-1]
    assert picker["__type__"] == "update" and len(picker["choices"]) == st["latest_step_groups"] and picker["value"] == 0
    assert "Inside" not in step_view and "gs-table" in step_view  # the table of the latest group
    assert "wi-adv" in what_if_box  # the What-if box recomputed for that group, with the run's weights
    assert json.loads(httpx.get(f"{live}/memory").json()[0]["plot"])["data"]

    assert "Stopping" in client.predict(api_name="/stop")
    st = wait_for(lambda: (s := status(client))["state"] == "stopped" and s, 300, what="stopped")
    ck = [p for p in (app_server.runs_dir / run_id / "checkpoints").rglob("COMPLETE")]
    assert ck, "Stop keeps a resumable checkpoint"
    stopped_step = st["step"]

    assert "Resumed" in client.predict(api_name="/resume")
    wait_for(lambda: (s := status(client))["step"] > stopped_step and s["active"], 300, what="progress after resume")
    client.predict(api_name="/stop")
    wait_idle(client)
    events = [
        json.loads(line)["event"] for line in (app_server.runs_dir / run_id / "events.jsonl").read_text().splitlines()
    ]
    assert events.count("stopped") == 2 and "resumed" in events


def test_completed_run_compare_try_runs_download_delete(client, app_server):  # noqa: F811
    run_id = run_to_completion(
        client,
        preset="tiny-short",
        stages=stages(["s1", "arithmetic", 1, 1, 2], ["s2", "arithmetic", 2, 2, 2]),
        completion_length=16,
        run_name="done",
    )

    table, pick, _side_runs = client.predict(None, api_name="/runs")
    row = next(r for r in table["data"] if r[0] == run_id)
    assert row[1] == "completed" and row[2] == "tiny-short" and row[4] == "s1 → s2" and row[5] == "4/4"

    out = client.predict("run", run_id, "", "", "gsm8k", 4, 0, 10, 0, 32, api_name="/compare")
    progress_html, summary, chart, side_by_side, csv_path = out  # (the page's job-id state is not part of the API)
    assert "finished" in progress_html and summary.count('class="card-big"') == 2  # both accuracies
    assert "95% interval" in summary and "McNemar" in summary and "format rate" in summary
    assert len(side_by_side["data"]) == 4 and {r[5] for r in side_by_side["data"]} <= {"✓", "✗"}
    assert json.loads(chart["plot"])["data"][0]["type"] == "bar"
    assert Path(csv_path).read_text().startswith("id,difficulty,question,gold")
    again = client.predict("run", run_id, "", "", "gsm8k", 4, 0, 10, 0, 32, api_name="/compare")
    assert "loaded from cache" in again[1]  # cached per (models, problems, N, seed)

    held = client.predict("run", run_id, "", "", "stage:1", 4, 0, 10, 0, 32, api_name="/compare")
    assert "held-out problems like stage 2" in held[0] and "none of these 4 problems occurs" in held[0]
    assert held[1].count('class="card-big"') == 2

    answers = client.predict("run", run_id, "", "", "What is 12 + 30?", "42", 24, api_name="/try")
    assert answers[1].count("Extracted answer") == 1 and answers[2].count("Extracted answer") == 1
    assert "expected 42" in answers[1] + answers[2] or "correct" in answers[1] + answers[2]

    details = client.predict(run_id, api_name="/open_run")
    assert run_id in details[0] and "completed" in details[0]
    assert json.loads(details[1]["plot"])["layout"]["uirevision"] == run_id
    assert {r[0] for r in details[6]["data"]} >= {"gsm8k-n4-seed0-d0-10"}  # its Compare results

    zip_path, msg = client.predict(run_id, api_name="/download")
    names = zipfile.ZipFile(zip_path).namelist()
    assert f"{run_id}/config.json" in names and f"{run_id}/model.safetensors" in names and "ready" in msg

    kept = client.predict(run_id, "delete", api_name="/delete")
    assert "nothing was deleted" in kept[0] and (app_server.runs_dir / run_id).is_dir()
    gone = client.predict(run_id, run_id, api_name="/delete")
    assert "Deleted" in gone[0] and not (app_server.runs_dir / run_id).exists()
    assert run_id not in text_of(client.predict(None, api_name="/runs"))


def test_upload_then_train_on_it(client, app_server, tmp_path):  # noqa: F811
    from gradio_client import handle_file

    data = tmp_path / "my_problems.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(12)))
    msg, err = client.predict(handle_file(str(data)), api_name="/upload")
    assert "12 problems" in msg and not text_of(err)
    run_id = run_to_completion(
        client,
        preset="tiny-short",
        upload=handle_file(str(data)),
        stages=stages(["mine", "custom", 0, 5, 2]),
        run_name="../My Run!",
    )
    assert run_id.endswith("-My-Run")  # the run name was sanitised
    events = (app_server.runs_dir / run_id / "events.jsonl").read_text()
    assert "custom file" in events


def test_system_panel(client):
    md = client.predict(api_name="/system")
    assert "Cores" in md and "Memory" in md and "torch" in md


def test_an_idle_connection_outlives_the_longest_poll_period(app_server):  # noqa: F811
    # Pages polling every 10-30 s reuse their connection; uvicorn's own 5-s keep-alive would close it under them.
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", app_server.port, timeout=30)
    conn.request("GET", "/config")
    assert conn.getresponse().read()
    sock = conn.sock
    time.sleep(8)
    conn.request("GET", "/config")  # on the same socket: a closed one raises RemoteDisconnected here
    assert conn.getresponse().status == 200 and conn.sock is sock
    conn.close()
