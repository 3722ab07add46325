"""Pages name models by run id and model name, never by the server folder they live in (issue 18, class 9).

The Compare and Try handlers of the real page are called in-process on a run whose trained model is a tiny
random model saved in the run folder."""

import json

import pytest

from grpo_app.core.config import load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunManager

from .app_server import ROOT
from .conftest import make_tiny


@pytest.fixture
def app_and_run(tmp_path, tokenizer, monkeypatch):
    from grpo_app.core.models import cache_root
    from grpo_app.ui import app as ui_app

    monkeypatch.setenv("GRPO_APP_CACHE_DIR", str(cache_root()))  # the embedded tokenizer the tiny model borrows
    monkeypatch.setenv("GRPO_APP_MODELS_DIR", str(tmp_path / "models"))  # (the comparison cache goes there)
    root = tmp_path / "server-private-runs"
    run = RunDir.create(root, load_config("tests/configs/tiny.yaml"))
    model = make_tiny(tokenizer)
    model.save_pretrained(run.final_dir)
    tokenizer.save_pretrained(run.final_dir)
    run.write_status(status="completed")
    demo = ui_app.build_app(manager=RunManager(root), configs_dir="tests/configs/app", default_preset="tiny-app")
    fns = {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}
    return fns, run, root


def _text(outputs) -> str:
    return json.dumps(outputs, default=str)


def test_try_names_the_run_not_its_folder(app_and_run):
    fns, run, root = app_and_run
    for mode, base, trained in (("run", None, None), ("models", "tiny-random", run.id)):
        outputs = list(fns["try"](mode, run.id, base, trained, "What is 2 + 3?", "5", 8))
        shown = _text(outputs)
        assert run.id in shown and str(root) not in shown and "server-private-runs" not in shown, shown[:2000]


def test_compare_names_the_run_not_its_folder(app_and_run):
    fns, run, root = app_and_run
    for mode, base, trained in (("run", None, None), ("models", "tiny-random", run.id)):
        outputs = list(fns["compare"](mode, run.id, base, trained, "gsm8k", 2, 0, 20, 0, 16, 0, 1.0, None))
        *_, last = outputs
        assert "Failed" not in str(last[1]), last[1]
        shown = _text([o for o in last if not (isinstance(o, str) and o.endswith(".csv"))])  # (the CSV's temp path)
        assert run.id in shown and str(root) not in shown and "server-private-runs" not in shown, shown[:2000]


# ------------------------------------------------------------------------------------------------
# Issue 45, 1: every text a page can receive for one run with a GSM8K stage, walked through the real app
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, shown", [
    ("GSM8K train (local folder /srv/private/gsm8k), difficulty 1-3", "GSM8K train (local folder …/gsm8k), difficulty 1-3"),
    ("OSError: [Errno 28] No space left on device: '/srv/app/models/runs/x/final'", "OSError: [Errno 28] No space left on device: '…/final'"),
    ("3/4 of a/b, http://localhost:7860/x and ./models/runs", "3/4 of a/b, http://localhost:7860/x and ./models/runs"),
    ("ends with a folder /srv/app/", "ends with a folder …/"),
])
def test_hide_server_paths(text, shown):
    from grpo_app.core.fileio import hide_server_paths

    assert hide_server_paths(text) == shown


def _fake_gsm8k(folder, n=40):
    """GSM8K-shaped problems of our own (the real set stays in ../shared): one or two calculator steps each."""
    folder.mkdir(parents=True)
    for split in ("train", "test"):
        with (folder / f"{split}.jsonl").open("w") as fh:
            for i in range(n):
                a, b = 3 + i, 5 + 2 * i
                steps = f"<<{a}+{b}={a + b}>>" + (f" <<{a + b}*2={2 * (a + b)}>>" if i % 2 else "")
                fh.write(json.dumps({"question": f"Sam has {a} apples and buys {b} more{' and doubles them' if i % 2 else ''}. "
                                     "How many apples does Sam have?",
                                     "answer": f"{steps}\n#### {(a + b) * (2 if i % 2 else 1)}"}) + "\n")


def test_no_page_text_names_a_server_folder(tmp_path_factory):
    """Status, live view (poll, draw, memory), run view, run log, configuration, errors: one run with a GSM8K stage
    from a local GSM8K folder, on a server whose folders are all absolute paths; none of them may reach a page."""
    import httpx

    from tests.app_server import AppServer, stages, start_args, status, text_of, wait_for

    work = tmp_path_factory.mktemp("server-private-work")
    gsm = work / "server-private-gsm8k"
    _fake_gsm8k(gsm)
    server = AppServer(work / "app", extra_env={"GRPO_APP_GSM8K_DIR": str(gsm)}).start()
    try:
        client = server.client()
        texts = []
        msg = client.predict(*start_args(stages=stages(["add", "arithmetic", 1, 1, 2], ["words", "gsm8k", 1, 2, 2]),
                                         completion_length=16, run_name="paths"), api_name="/start")
        texts.append(text_of(msg))
        assert "Started run" in msg[0], msg
        run_id = msg[0].split("**")[1]
        wait_for(lambda: (s := status(client))["run_id"] == run_id and s["state"] == "completed", 300, what="completion")
        texts.append(json.dumps(status(client)))
        for route in ("poll", "draw", "memory"):
            r = httpx.get(f"{server.url}/grpo_app/{route}", params={"page": "p1"}, timeout=60)
            assert r.status_code == 200, r.text
            texts.append(r.text)
        live = texts[-2]
        assert "local GSM8K folder (GRPO_APP_GSM8K_DIR)" in live, live[-3000:]  # the run log names the source
        details = client.predict(run_id, api_name="/open_run")
        texts.append(text_of([d for d in details if not (isinstance(d, dict) and "plot" in d)]))
        texts.append(text_of(client.predict(run_id, api_name="/run_config")))
        texts.append(text_of(client.predict(None, api_name="/runs")))
        # errors a page can provoke
        for args, api in ((start_args(model="/etc"), "/start"),  # (what a user typed may be echoed; nothing else)
                          (start_args(model="~/x"), "/start"), (["/etc"], "/open_run"), (["20990101-000000-x"], "/resume_run")):
            try:
                texts.append(text_of(client.predict(*args, api_name=api)))
            except Exception as e:  # noqa: BLE001 - a gr.Error reaches the client as an exception with the page's text
                texts.append(str(e))
        shown = "\n".join(texts)
        assert "outside the model folders this app may read (the app's models/ folder)" in shown
        for private in (str(work), str(gsm), str(server.runs_dir), str(ROOT), "server-private"):
            assert private not in shown, (private, shown[max(0, shown.find(private) - 500):][:1500])
    finally:
        server.stop()
