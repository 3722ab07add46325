"""Pages name models by run id and model name, never by the server folder they live in (issue 18, class 9).

The Compare and Try handlers of the real page are called in-process on a run whose trained model is a tiny
random model saved in the run folder."""

import json

import pytest

from grpo_app.config import load_config
from grpo_app.manager import RunManager
from grpo_app.runs import RunDir

from .conftest import make_tiny


@pytest.fixture
def app_and_run(tmp_path, tokenizer, monkeypatch):
    from grpo_app.models import cache_root
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
