"""Everything that crosses the edge of the real app: bad inputs get a clear message (and start nothing),
the app keeps answering, twenty pages can watch a run, two simultaneous Starts make one run, and
Ctrl-C stops a run cleanly with a checkpoint."""

import json
import threading
import time

import httpx
import pytest

from tests.app_server import (  # noqa: F401
    AppServer,
    app_server,
    stages,
    start_args,
    status,
    text_of,
    wait_for,
    wait_idle,
)

SHARED_GSM8K = __import__("pathlib").Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="module")
def client(app_server):  # noqa: F811
    return app_server.client()


def upload_file(tmp_path, name, content: bytes):
    from gradio_client import handle_file

    p = tmp_path / name
    p.write_bytes(content)
    return handle_file(str(p))


def call(client, api_name, args):
    """(text a person would read, whether the app raised): gradio_client raises for gr.Error messages."""
    try:
        return text_of(client.predict(*args, api_name=api_name)), False
    except Exception as e:  # noqa: BLE001 - AppError carries the message shown on the page
        return str(e), True


S = stages
# (id, endpoint, args or a function of tmp_path giving args, the message a person sees)
CASES = [
    # Train form: numbers out of range or of the wrong type
    ("G=1", "/start", start_args(num_generations=1), "use 2 to 64"),
    ("G=text", "/start", start_args(num_generations="many"), "expected a whole number, got 'many'"),
    ("G=100", "/start", start_args(num_generations=100), "100 is out of range"),
    ("length=0", "/start", start_args(completion_length=0), "completion length: 0 is out of range"),
    ("length=5000", "/start", start_args(completion_length=5000), "completion length: 5000 is out of range"),
    ("prompts=0", "/start", start_args(prompts_per_step=0), "prompts per step: 0 is out of range"),
    ("lr=text", "/start", start_args(learning_rate="fast"), "expected a number such as 1e-5"),
    ("lr<0", "/start", start_args(learning_rate="-1e-5"), "must be above 0"),
    ("lr huge", "/start", start_args(learning_rate="0.5"), "at most 0.01"),
    ("lambda<0", "/start", start_args(ewc_lambda=-5), "EWC λ: -5 is out of range"),
    ("seed<0", "/start", start_args(seed=-1), "seed: -1 is out of range"),
    ("seed float", "/start", start_args(seed=1.5), "seed: expected a whole number"),
    ("ewc=maybe", "/start", start_args(ewc="maybe"), "expected on or off"),
    # presets and data sources outside the choices
    ("unknown preset", "/start", start_args(preset="nope"), "nope"),
    ("unknown data source", "/start", start_args(data_source="ftp"), "ftp"),
    ("preset endpoint", "/preset", ["../../etc/passwd"], "not in the list of choices"),
    # model names: only hub-id syntax, 'embedded', a run id, or folders under the allowed roots
    ("model ../etc", "/start", start_args(model="../etc"), "paths with '..' are not allowed"),
    ("model /etc/passwd", "/start", start_args(model="/etc/passwd"), "outside the model folders"),
    ("model abs dir", "/start", start_args(model="/tmp"), "outside the model folders"),
    ("model ~", "/start", start_args(model="~/.cache"), "outside the model folders"),
    ("model junk", "/start", start_args(model="not a model!"), "is not 'embedded', a hub id"),
    ("model empty", "/start", start_args(model="  "), "no model given"),
    ("model huge", "/start", start_args(model="x/" + "y" * 300), "characters long"),
    ("hub id offline", "/start", start_args(model="someone/not-cached-model"), "cannot be reached"),
    # stages: empty, inverted, impossible, repeated, unknown source, too many
    ("no stages", "/start", start_args(stages=S()), "no stages"),
    ("inverted range", "/start", start_args(stages=S(["a", "arithmetic", 3, 1, 5])), "range 3..1 is empty"),
    ("unknown source", "/start", start_args(stages=S(["a", "algebra", 1, 1, 5])), "'algebra' is not one of"),
    ("zero steps", "/start", start_args(stages=S(["a", "arithmetic", 1, 1, 0])), "steps: 0 is out of range"),
    ("impossible arithmetic", "/start", start_args(stages=S(["a", "arithmetic", 7, 9, 2])), "must lie in 1..5"),
    (
        "difficulty text",
        "/start",
        start_args(stages=S(["a", "arithmetic", "easy", 1, 2])),
        "expected a whole number, got 'easy'",
    ),
    (
        "repeated stage",
        "/start",
        start_args(stages=S(["a", "arithmetic", 1, 2, 2], ["b", "arithmetic", 1, 2, 2])),
        "repeats stage 1",
    ),
    (
        "too many stages",
        "/start",
        start_args(stages=S(*[[f"s{i}", "arithmetic", 1, 1, 1] for i in range(11)])),
        "too many",
    ),
    ("custom without file", "/start", start_args(stages=S(["a", "custom", 1, 1, 2])), "custom_path is empty"),
    # uploads: too big, not UTF-8, missing columns, non-numeric answers per row, empty, wrong type
    (
        "upload too big",
        "/upload",
        lambda t: [upload_file(t, "big.jsonl", b'{"question":"q","answer":"1"}\n' * 200_000)],
        "exceeds the maximum file size of 5242880 bytes",
    ),
    (
        "upload latin-1",
        "/upload",
        lambda t: [upload_file(t, "l1.csv", "question,answer\nCombien coûte?,3\n".encode("latin-1"))],
        "not UTF-8 text",
    ),
    (
        "upload no columns",
        "/upload",
        lambda t: [upload_file(t, "cols.csv", b"q,a\nwhat,1\n")],
        "must include 'question' and 'answer' columns",
    ),
    (
        "upload bad answers",
        "/upload",
        lambda t: [
            upload_file(
                t,
                "ans.jsonl",
                b'{"question":"a?","answer":"seven"}\n'
                b'{"question":"b?","answer":"2"}\n'
                b'{"question":"c?","answer":"lots"}\n',
            )
        ],
        "2 bad rows: line 1: answer 'seven' is not a number",
    ),
    (
        "upload bad json",
        "/upload",
        lambda t: [upload_file(t, "j.jsonl", b'{"question": "a?", "answer": 1}\n{oops\n')],
        "line 2: not valid JSON",
    ),
    ("upload empty", "/upload", lambda t: [upload_file(t, "e.csv", b"question,answer\n")], "no rows found"),
    (
        "upload wrong type",
        "/upload",
        lambda t: [upload_file(t, "x.txt", b"question,answer\n1?,1\n")],
        "Invalid file type",
    ),
    (
        "start with bad upload",
        "/start",
        lambda t: start_args(
            upload=upload_file(t, "b.csv", b"question,answer\nq,x\n"), stages=S(["a", "custom", 1, 1, 2])
        ),
        "is not a number",
    ),
    # run ids for resume / open / download / delete
    ("resume ../x", "/resume_run", ["../x"], "is not a run id"),
    ("resume unknown", "/resume_run", ["20990101-000000-none"], "There is no run"),
    ("open /etc", "/open_run", ["/etc"], "is not a run id"),
    ("download ../..", "/download", ["../../models"], "is not a run id"),
    ("delete ../x", "/delete", ["../x", "../x"], "is not a run id"),
    ("delete unknown", "/delete", ["nope-run", "nope-run"], "no run 'nope-run'"),
    # Compare: N bounds, ranges, models
    (
        "N=0",
        "/compare",
        ["models", None, "tiny-random", "tiny-random", "gsm8k", 0, 0, 10, 0, 32],
        "N (problems): 0 is out of range",
    ),
    (
        "N huge",
        "/compare",
        ["models", None, "tiny-random", "tiny-random", "gsm8k", 10**6, 0, 10, 0, 32],
        "is out of range",
    ),
    (
        "N text",
        "/compare",
        ["models", None, "tiny-random", "tiny-random", "gsm8k", "all", 0, 10, 0, 32],
        "expected a whole number",
    ),
    (
        "empty difficulty",
        "/compare",
        ["models", None, "tiny-random", "tiny-random", "gsm8k", 5, 6, 2, 0, 32],
        "is empty",
    ),
    (
        "compare /etc",
        "/compare",
        ["models", None, "/etc/passwd", "tiny-random", "gsm8k", 5, 0, 10, 0, 32],
        "outside the model folders",
    ),
    ("compare no run", "/compare", ["run", "", "", "", "gsm8k", 5, 0, 10, 0, 32], "pick a run"),
    # Try: empty / huge questions, bad expected answer, models
    ("try empty", "/try", ["models", None, "tiny-random", "tiny-random", "   ", "", 32], "Type a question"),
    ("try huge", "/try", ["models", None, "tiny-random", "tiny-random", "why? " * 2000, "", 32], "characters long"),
    (
        "try gold text",
        "/try",
        ["models", None, "tiny-random", "tiny-random", "2+2?", "four", 32],
        "'four' is not a number",
    ),
    ("try tokens", "/try", ["models", None, "tiny-random", "tiny-random", "2+2?", "", 100000], "100000"),
    (
        "try ../model",
        "/try",
        ["models", None, "../../x", "tiny-random", "2+2?", "", 32],
        "paths with '..' are not allowed",
    ),
]
if SHARED_GSM8K.is_dir():
    CASES.append(
        (
            "gsm8k range empty",
            "/start",
            start_args(stages=S(["g", "gsm8k", 15, 20, 2])),
            "only 0 GSM8K training problems",
        )
    )


def test_the_table_is_big_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_message_and_the_app_keeps_answering(client, app_server, tmp_path, case):  # noqa: F811
    _, api_name, args, expected = case
    args = args(tmp_path) if callable(args) else args
    runs_before = sorted(p.name for p in app_server.runs_dir.glob("*") if p.is_dir())
    text, _raised = call(client, api_name, args)
    assert expected in text, text[:1000]
    assert "Traceback" not in text and 'File "' not in text  # a message for people, not a stack trace
    assert not status(client)["active"]  # nothing started ...
    assert sorted(p.name for p in app_server.runs_dir.glob("*") if p.is_dir()) == runs_before  # ... and no run folder
    assert "Cores" in client.predict(api_name="/system")  # the app still answers


def test_twenty_watchers_and_two_simultaneous_starts(app_server):  # noqa: F811
    """Twenty pages poll while a short run trains: no errors, all see the same final step. Two Start
    requests at the same moment create exactly one run."""
    main = app_server.client()
    wait_idle(main)
    before = {p.name for p in app_server.runs_dir.glob("*") if p.is_dir()}

    barrier = threading.Barrier(2)
    replies = []

    def press_start():
        c = app_server.client()
        barrier.wait()
        replies.append(
            c.predict(
                *start_args(stages=S(["a", "arithmetic", 1, 1, 4], ["b", "arithmetic", 2, 2, 4])), api_name="/start"
            )[0]
        )

    starters = [threading.Thread(target=press_start) for _ in range(2)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(120)
    assert sorted("Started run" in r for r in replies) == [False, True], replies
    assert any("A run is in progress" in r for r in replies)
    new = {p.name for p in app_server.runs_dir.glob("*") if p.is_dir()} - before
    assert len(new) == 1
    run_id = new.pop()

    errors, finals, polls = [], [], []
    live = f"{app_server.url}/grpo_app"  # the page's live view (ui/live.py)

    def watch(i):
        try:
            c = app_server.client()
            deadline = time.time() + 300
            while time.time() < deadline:
                if i % 2 == 0:  # half of them also tick like a page's timer (status line, markers, then the draw)
                    out = httpx.get(f"{live}/poll?page=watcher-{i}", timeout=60).json()
                    assert len(out) == 4 and 1.0 <= out[3] <= 30  # markers, then the poll period the server sets
                    drawn = httpx.get(f"{live}/draw?page=watcher-{i}&size=2", timeout=60).json()
                    assert "layout" in json.loads(drawn[0]["plot"])  # the reward chart
                    polls.append(1)
                st = c.predict(api_name="/status")
                assert st["run_id"] == run_id
                if not st["active"] and st["state"] == "completed":
                    finals.append(st["step"])
                    return
                time.sleep(0.3)
            errors.append(f"watcher {i} timed out")
        except Exception as e:  # noqa: BLE001
            errors.append(f"watcher {i}: {type(e).__name__}: {e}")

    watchers = [threading.Thread(target=watch, args=(i,)) for i in range(20)]
    for t in watchers:
        t.start()
    for t in watchers:
        t.join(400)
    assert errors == []
    assert finals == [8] * 20  # everyone saw the same final step count
    assert len(polls) >= 10
    last_poll = httpx.get(f"{live}/poll?page=main").json()
    charts = httpx.get(f"{live}/draw?page=main&size=2").json()
    assert run_id in last_poll[0] and len(json.loads(charts[0]["plot"])["data"][0]["x"]) == 8


def test_ctrl_c_stops_the_run_with_a_checkpoint(tmp_path):
    server = AppServer(tmp_path / "sigint").start()
    try:
        c = server.client()
        msg = c.predict(*start_args(), api_name="/start")[0]
        run_id = msg.split("**")[1]
        wait_for(lambda: status(c)["step"] >= 2, 300, what="two steps")
        server.interrupt()  # what Ctrl-C does to `python app.py`
        code = server.proc.wait(300)
    finally:
        server.kill()
    assert code == 0, server.log_tail()
    log = server.log_tail()
    assert "Stopping the training run" in log and f"run {run_id} stopped with a checkpoint" in log
    run_dir = server.runs_dir / run_id
    st = json.loads((run_dir / "status.json").read_text())
    assert st["status"] == "stopped"
    events = [json.loads(x)["event"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1] == "stopped"
    assert list((run_dir / "checkpoints").rglob("COMPLETE"))
