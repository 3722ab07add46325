"""Many pages watching one training run: how fast the server answers them, and what they cost training.

    python bench/watchers.py [--pages 30 100] [--seconds 60] [--model tiny|embedded|embedded-short]
                             [--mode page|status] [--pages-priority normal|idle]
                             [--training app|app-thread|cli] [--rounds 1] [--out assets/watchers.json]

It starts the real app (`python app.py`, as tests/app_server.py does: 127.0.0.1 on a free port, a
temporary runs folder, offline), starts a training run through the app's own /start endpoint, and then:

1. measures the training step time for `--seconds` with no page open (a baseline phase);
2. for each N in `--pages`: N simulated pages poll for `--seconds`, each at the period the server's
   last answer set (the Train tab's timer: 1.5 s, longer when many pages watch, `grpo_app/ui/pacing.py`),
   their first polls spread over 1.5 s; every answer's latency (request sent -> full answer
   read) and every error (HTTP status, Gradio error event, or no answer within 30 s) is recorded, and the
   step times of the steps that ended in that window;
3. another baseline phase; with `--rounds R`, steps 2-3 run R times. Each page phase's slowdown is taken
   against the baseline phases just before and after it (their mean median step), because this host's
   speed drifts over minutes; the summary per N pools its rounds (mean slowdown and its 95% interval).
   Those per-phase figures count only the steps that started and ended inside a phase; with phases only
   a few steps long that favours the short steps of the shorter phases (the baselines), so they overstate
   the slowdown. `lockin` (per N) uses every step instead, weighted by the share of it spent under the
   pages, against the drift around it (`lockin_slowdown`); on a host whose speed drifts by 10-40% between
   minutes, many short rounds (e.g. `--seconds 20 --rounds 30`, steps of ~10 s) measure it best.

`--training app` (the default) is the app as it ships: its Start trains in a child process
(`RunManager(process=True)`). `--training app-thread` starts the app with GRPO_APP_TRAIN_PROCESS=0, so
the run trains in a thread of the server's process, as it did before. With `--training cli` the run is not started from the app but by `python -m grpo_app train` in a
process of its own, into the runs folder the app serves; the app's Train tab then follows it through its
files, as it does for any run another process trains, and the app process only serves the pages.

A page (`--mode page`, the default) polls the way the browser does: the Train tab's timer event fetches
the live view's `/grpo_app/poll` (the status line and two change markers), and when a marker changed, the
event that draws that part fetches `/grpo_app/draw` (everything a new step changes, in one request) or
`/grpo_app/memory`, as the page's own change listeners do; the latency reported is the poll's, the draws are
counted and timed apart. Since 2026-11-25 these are plain routes, not Gradio events (grpo_app/ui/live.py);
before, the same three were unqueued Gradio events (one POST to `/gradio_api/run/<name>` each), and the
figures in docs/performance.md from before then were measured that way. (Before 2026-11-24 a step took three
draws from a real page: `/charts`, `/latest_step` and, through the step view's change listener, a queued
What-if update that this bench did not send; its figures from before then undercount a browser's requests
by one per step.) A script (`--mode status`) calls the `/status` API through Gradio's HTTP routes, as the
Python client would (join + event stream).

Besides the quantiles of every poll, each phase reports `steady` (the same without each page's first
poll: all pages open within 1.5 s and each then draws twice, a burst a class that opens the page before
Start does not make), `slow_polls` (when in the phase each poll over 0.5 s was sent, and its latency) and
`client_loop_lag` (how late this process's own event loop woke from 50-ms sleeps: with `--pages-priority
idle` an answer can wait for the pages' process to get a core, a wait a browser elsewhere would not add).

The pages run in this process (asyncio + httpx), on the same machine as the server: their own CPU time
counts against training, as a worst case. Only 127.0.0.1 is contacted. The model is the tiny random one
(`--model tiny`, seconds per step) or the embedded SmolLM2-135M with the classroom preset's step
(`--model embedded`), or the embedded model with a short step (`--model embedded-short`: enough steps
in a phase to measure the slowdown). Prints one JSON object; `--out` writes it too. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import emit  # noqa: E402
from grpo_app.ui.pacing import budget_from_env, max_period_from_env  # noqa: E402

PERIOD_S = 1.5  # the Train tab's timer (GRPO_APP_TIMER_S default)
ANSWER_TIMEOUT_S = 30.0

PRESETS = {
    "tiny": """preset: bench-watchers
description: watcher bench - tiny random model
model: {name: tiny-random}
stages:
  - {name: add, source: arithmetic, min_difficulty: 1, max_difficulty: 1, steps: 5000, num_problems: 64}
rewards:
  weights: {correctness: 1.0, has_number: 1.0}
grpo: {num_generations: 4, prompts_per_step: 2, max_completion_length: 24, learning_rate: 0.001}
ewc: {enabled: false}
run: {save_every: 0, keep_checkpoints: 1, eval_n: 0}
""",
    "embedded": """preset: bench-watchers
description: watcher bench - embedded SmolLM2-135M, the classroom preset's step
model: {name: embedded}
stages:
  - {name: add, source: arithmetic, min_difficulty: 1, max_difficulty: 1, max_digits: 2, steps: 5000, num_problems: 2048}
grpo: {num_generations: 8, prompts_per_step: 4, micro_batch_size: 8, max_completion_length: 96}
ewc: {enabled: false}
run: {save_every: 0, keep_checkpoints: 1, eval_n: 0}
""",
    # The classroom step's batch (G = 8, 4 prompts, micro-batches of 8) with 32-token completions and a
    # learning rate so small that what is sampled stays alike: steps of 12-20 s (measured), enough of them in a
    # 5-minute phase to measure a slowdown.
    "embedded-short": """preset: bench-watchers
description: watcher bench - embedded SmolLM2-135M, a short step
model: {name: embedded}
stages:
  - {name: add, source: arithmetic, min_difficulty: 1, max_difficulty: 1, max_digits: 2, steps: 5000, num_problems: 2048}
grpo: {num_generations: 8, prompts_per_step: 4, micro_batch_size: 8, max_completion_length: 32, learning_rate: 1.0e-9}
ewc: {enabled: false}
run: {save_every: 0, keep_checkpoints: 1, eval_n: 0}
""",
}
START_ARGS = {name: [["add", "arithmetic", 1, 1, 5000]] for name in PRESETS}  # the /start form, as each preset


# ------------------------------------------------------------------------------------------------
# The app
# ------------------------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cli_training(work: Path) -> tuple[subprocess.Popen, str]:
    """The same preset trained by the CLI in a process of its own (`--training cli`), into the runs folder the
    app shows: the app then follows the run through its files and only serves the pages."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GRPO_APP_RUNS_DIR=str(work / "runs"))
    env.pop("GRPO_APP_MAX_STEP_MINUTES", None)
    log = open(work / "train.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_app", "train", "--config", str(work / "configs" / "bench-watchers.yaml"),
         "--name", "watchers"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        runs = sorted((work / "runs").glob("*-watchers")) if (work / "runs").is_dir() else []
        if runs:
            return proc, runs[-1].name
        if proc.poll() is not None:
            raise SystemExit(f"the CLI training exited:\n{(work / 'train.log').read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the CLI training made no run folder within 300 s")


def start_app(work: Path, model: str, thread: bool = False, root: Path = ROOT) -> tuple[subprocess.Popen, str]:
    from grpo_app.core.models import cache_root, embedded_model_dir

    embedded_model_dir()  # the tiny model borrows the embedded tokenizer
    configs = work / "configs"
    configs.mkdir()
    (configs / "bench-watchers.yaml").write_text(PRESETS[model])
    port = free_port()
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        GRADIO_SERVER_PORT=str(port),
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_TEMP_DIR=str(work / "gradio"),
        GRPO_APP_RUNS_DIR=str(work / "runs"),
        GRPO_APP_MODELS_DIR=str(work / "models"),
        GRPO_APP_CACHE_DIR=str(cache_root()),
        GRPO_APP_CONFIGS_DIR=str(configs),
        GRPO_APP_DEFAULT_PRESET="bench-watchers",
        GRPO_APP_TRAIN_PROCESS="0" if thread else "1",
    )
    env.pop("SPACE_ID", None)
    log = open(work / "app.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited:\n{(work / 'app.log').read_text()[-3000:]}")
        try:
            if httpx.get(url + "/config", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the app did not answer within 300 s")


def stop_app(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the app stops its run, then exits
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def start_training(url: str, model: str) -> str:
    from gradio_client import Client

    client = Client(url, verbose=False)
    headers = ["name", "source", "min difficulty", "max difficulty", "steps"]
    preset = client.predict("bench-watchers", api_name="/preset")
    args = [
        "bench-watchers",
        preset[1],  # model
        preset[2],  # data source
        None,
        {"headers": headers, "data": START_ARGS[model]},
        preset[4],  # G
        preset[5],  # completion length
        preset[6],  # prompts per step
        preset[7],  # learning rate
        False,  # EWC (one stage)
        preset[9],
        False,  # LoRA
        preset[11],  # seed
        "watchers",
        preset[12],  # loss type
        preset[13],  # advantage scaling
        preset[14],  # rewards of your own
    ]
    msg = client.predict(*args, api_name="/start")[0]
    if "Started run" not in msg:
        raise SystemExit(f"could not start training: {msg}")
    client.close()
    return msg.split("**")[1]


def step_spans(metrics_path: Path) -> list[tuple[float, float, float]]:
    """(start, end, tokens generated) of every step in the run's metrics."""
    out = []
    if not metrics_path.is_file():
        return out
    for line in metrics_path.read_text().splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        s, end, rate = m.get("step_seconds"), m.get("time"), m.get("tokens_per_s")
        if s and end:
            out.append((end - s, end, rate * s if rate else 0.0))
    return out


def step_fields(spans: list[tuple[float, float, float]], t0: float, t1: float) -> dict:
    """A phase's steps (those that started and ended inside [t0, t1]): their median time, and seconds per
    generated token over all of them (a step's time follows how long its sampled answers were, which varies from
    step to step; per token it does much less)."""
    recs = [(end - start, tokens) for start, end, tokens in spans if t0 <= start and end <= t1]
    steps, tokens = [s for s, _ in recs], sum(t for _, t in recs)
    return {
        "step_s_median": median(steps),
        "steps": len(steps),
        "step_s": steps,
        "ms_per_token": round(1000 * sum(steps) / tokens, 3) if tokens else None,
    }


# ------------------------------------------------------------------------------------------------
# Pages
# ------------------------------------------------------------------------------------------------
class Endpoint:
    """How a page's event reaches the server, read from the app's /config."""

    def __init__(self, url: str, name: str, cfg: dict):
        dep = next(d for d in cfg["dependencies"] if d.get("api_name") == name)
        self.url, self.name = url, name
        self.fn_index = dep["id"]
        self.queued = dep.get("queue") is not False and cfg.get("enable_queue", True)
        self.trigger_id = (dep.get("targets") or [[None]])[0][0]
        comps = {c["id"]: c for c in cfg["components"]}
        # the page sends its inputs: a gr.State as null (the server holds it per session), the prompt picker as 0,
        # the What-if sliders at their minimum
        self.data = [
            None if comps.get(i, {}).get("type") == "state" else _value(comps.get(i, {})) for i in dep.get("inputs", [])
        ]
        self.output_types = [comps.get(o, {}).get("type") for o in dep.get("outputs", [])]

    def body(self, session: str) -> dict:
        """The JSON a page posts for this event (to /run/<name> unqueued, /queue/join queued)."""
        return {
            "data": self.data,
            "event_data": None,
            "fn_index": self.fn_index,
            "trigger_id": self.trigger_id,
            "session_hash": session,
        }


def _value(comp: dict):
    """A number input's value as a page sends it: a slider at its minimum (valid whatever maximum the server set
    for the session since: the What-if group size's maximum follows the run's G), anything else 0."""
    props = comp.get("props") or {}
    v = props.get("minimum") if comp.get("type") == "slider" else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


class LiveEndpoint:
    """One of the Train tab's live-view routes (grpo_app/ui/live.py): what the page's frontend events fetch."""

    queued = False

    def __init__(self, url: str, name: str, params: dict | None = None):
        self.url, self.name, self.params = url, name, dict(params or {})

    def query(self, page_id: str) -> dict:
        return {"page": page_id, **self.params}


class Page:
    """The requests one simulated page sends."""

    # the poll's answer index of a marker -> the route that draws that part; the page's draw sends its prompt
    # (0), the What-if box's group size (empty: the server uses the whole group) and no weights (the server
    # uses the run's for a page it has not seen)
    DRAWS = {1: ("draw", {"group": 0}), 2: ("memory", {})}

    def __init__(self, url: str, mode: str):
        import httpx

        self.mode = mode
        cfg = httpx.get(url + "/config", timeout=30).json()
        names = {d.get("api_name") for d in cfg["dependencies"]}
        if mode == "page" and "poll" in names:  # an app from before 2026-11-25 (--app-root): the Gradio events
            self.poll = Endpoint(url, "poll", cfg)
            self.timer_output = next((i for i, t in enumerate(self.poll.output_types) if t == "timer"), None)
            self.draws = {1: Endpoint(url, "draw", cfg), 2: Endpoint(url, "memory_chart", cfg)}
        elif mode == "page":
            self.poll = LiveEndpoint(url, "poll")
            self.timer_output = 3  # the poll period the server sets (the page's gr.Timer takes it)
            self.draws = {i: LiveEndpoint(url, name, params) for i, (name, params) in self.DRAWS.items()}
        else:
            self.poll = Endpoint(url, "status", cfg)
            self.timer_output = None
            self.draws = {}


async def _read_events(resp, want: str | None):
    """Read an event stream until the event `want` completes (or any completion when want is None)."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            if line.startswith("event: error"):
                return False
            if line.startswith("event: complete"):
                return True
            continue
        try:
            msg = json.loads(line[5:].strip())
        except json.JSONDecodeError:
            continue
        if isinstance(msg, dict) and msg.get("msg") == "process_completed" and (want is None or msg.get("event_id") == want):
            return bool(msg.get("success"))
    return False


async def call(client, ep, session: str, script: bool = False):
    """One request: (ok, output data or None)."""
    if isinstance(ep, LiveEndpoint):  # what the page's frontend event does: one GET of a plain route
        r = await client.get(f"{ep.url}/grpo_app/{ep.name}", params=ep.query(session))
        if r.status_code != 200:
            return False, None
        return True, r.json()
    api = f"{ep.url}/gradio_api"
    if script:  # a script: the call API (join, then the event's stream)
        r = await client.post(f"{api}/call/{ep.name}", json={"data": []})
        if r.status_code != 200:
            return False, None
        event_id = r.json()["event_id"]
        async with client.stream("GET", f"{api}/call/{ep.name}/{event_id}") as resp:
            return resp.status_code == 200 and await _read_events(resp, None), None
    body = ep.body(session)
    if not ep.queued:  # what the page does for an unqueued event: one POST
        r = await client.post(f"{api}/run/{ep.name}", json=body)
        if r.status_code != 200:
            return False, None
        res = r.json()
        return "error" not in res, res.get("data")
    r = await client.post(f"{api}/queue/join", json=body)
    if r.status_code != 200:
        return False, None
    event_id = r.json()["event_id"]
    async with client.stream("GET", f"{api}/queue/data", params={"session_hash": session}) as resp:
        return resp.status_code == 200 and await _read_events(resp, event_id), None


async def timed(coro, out: dict, key: str) -> tuple[bool, object]:
    t0 = time.perf_counter()
    try:
        ok, data = await asyncio.wait_for(coro, ANSWER_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
        ok, data = False, None
        out["error_kinds"][type(e).__name__] = out["error_kinds"].get(type(e).__name__, 0) + 1
    if ok:
        out[key].append(time.perf_counter() - t0)
    else:
        out["errors"] += 1
    return ok, data


async def page(client, pg: Page, until: float, out: dict, rng: random.Random) -> None:
    session = uuid.uuid4().hex[:11]
    marks: dict = {}
    period = PERIOD_S
    await asyncio.sleep(rng.uniform(0, PERIOD_S))  # pages opened at different moments
    first = True
    while time.time() < until:
        t0 = time.perf_counter()
        n_before = len(out["latencies"])
        ok, data = await timed(call(client, pg.poll, session, script=pg.mode == "status"), out, "latencies")
        if len(out["latencies"]) > n_before:  # answered: note when, and whether it was the page's opening poll
            out["poll_log"].append((round(t0 - out["t0"], 3), round(out["latencies"][-1], 4), first))
        first = False
        if ok and data:  # a changed marker: the page's change listener asks for that part
            for i, ep in pg.draws.items():
                if i < len(data) and marks.get(i) != data[i]:
                    marks[i] = data[i]
                    await timed(call(client, ep, session), out, "draws")
            if pg.timer_output is not None and isinstance(data[pg.timer_output], (int, float)):
                period = float(data[pg.timer_output])  # the server's period: the browser restarts its timer with it
                out["periods"].append(period)
        await asyncio.sleep(max(0.0, period - (time.perf_counter() - t0)))  # the timer's period


async def loop_lag(until: float, out: dict, tick: float = 0.05) -> None:
    """How late this process's own event loop wakes up: with the pages at idle priority on a busy machine,
    an answer can sit unread while the loop waits for a core, and that wait counts in the latencies (a page
    in a browser on another machine would not have it)."""
    while time.time() < until:
        t0 = time.perf_counter()
        await asyncio.sleep(tick)
        out["lags"].append(max(0.0, time.perf_counter() - t0 - tick))


def quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)

    def q(p):
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None

    return {"n": len(xs), "p50_s": q(0.5), "p95_s": q(0.95), "max_s": round(xs[-1], 3) if xs else None}


async def watch(url: str, mode: str, n: int, seconds: float, seed: int) -> dict:
    import httpx

    pg = Page(url, mode)
    out = {"latencies": [], "draws": [], "errors": 0, "error_kinds": {}, "periods": [], "poll_log": [], "lags": [],
           "t0": time.perf_counter()}
    limits = httpx.Limits(max_connections=2 * n + 10, max_keepalive_connections=2 * n + 10)
    async with httpx.AsyncClient(timeout=ANSWER_TIMEOUT_S, limits=limits) as client:
        rng = random.Random(seed)
        until = time.time() + seconds
        await asyncio.gather(loop_lag(until, out), *(page(client, pg, until, out, rng) for _ in range(n)))
    polls = quantiles(out["latencies"])
    steady = quantiles([lat for _, lat, first in out["poll_log"] if not first])
    return {
        "pages": n,
        "answers": polls["n"],
        "errors": out["errors"],
        "error_kinds": out["error_kinds"],
        "p50_s": polls["p50_s"],
        "p95_s": polls["p95_s"],
        "max_s": polls["max_s"],
        "answers_per_s": round(polls["n"] / seconds, 1),
        "poll_period_s": quantiles(out["periods"]) if out["periods"] else None,  # what the server told the pages
        "draws": quantiles(out["draws"]) if mode == "page" else None,
        "queued": pg.poll.queued,
        # The same without each page's first poll (30 or 100 pages opening within 1.5 s, each then drawing
        # the step view and the memory chart): the latencies of pages that are already open.
        "steady": {"answers": steady["n"], "p50_s": steady["p50_s"], "p95_s": steady["p95_s"], "max_s": steady["max_s"]},
        "client_loop_lag": quantiles(out["lags"]),  # this process's own wake-up delay (see loop_lag)
        "slow_polls": [[t, lat] for t, lat, _ in out["poll_log"] if lat > 0.5][:300],  # [s into the phase, latency]
    }


def median(xs):
    return round(statistics.median(xs), 3) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[30, 100])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    ap.add_argument("--model", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--mode", choices=["page", "status"], default="page")
    ap.add_argument(
        "--pages-priority",
        choices=["normal", "idle"],
        default="normal",
        help="CPU priority of the simulated pages (idle: SCHED_IDLE, they only get CPU the app leaves, as pages "
        "in other machines' browsers would; their own scheduling delay then counts in the latencies)",
    )
    ap.add_argument(
        "--training",
        choices=["app", "app-thread", "cli"],
        default="app",
        help="app: the app's Start trains (in a child process, as shipped); app-thread: the same with "
        "GRPO_APP_TRAIN_PROCESS=0 (a thread of the server's process); cli: `python -m grpo_app train` trains in a "
        "process of its own and the app follows the run through its files",
    )
    ap.add_argument("--rounds", type=int, default=1, help="page phases (then a baseline) repeated this often")
    ap.add_argument(
        "--app-root",
        default=str(ROOT),
        help="serve the app of this checkout (e.g. a git worktree of an older commit, to compare side by side; "
        "its pages are driven the way that version's page asks)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if any(n < 1 or n > 500 for n in args.pages) or not 5 <= args.seconds <= 1800 or not 1 <= args.rounds <= 60:
        raise SystemExit("--pages between 1 and 500, --seconds between 5 and 1800, --rounds between 1 and 60")

    with tempfile.TemporaryDirectory(prefix="watchers-") as tmp:
        work = Path(tmp)
        proc, url = start_app(work, args.model, thread=args.training == "app-thread", root=Path(args.app_root))
        trainer = None
        try:
            if args.training == "cli":
                trainer, run_id = start_cli_training(work)
            else:
                run_id = start_training(url, args.model)
            metrics = work / "runs" / run_id / "metrics.jsonl"
            deadline = time.time() + 600
            while not step_spans(metrics) and time.time() < deadline:
                time.sleep(1)  # the model loaded and a first step ended: training is warm
            if args.pages_priority == "idle":
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this process only (the app started)
            cpu = CpuMeter(proc.pid)
            phases = [baseline_phase(args.seconds, cpu)]
            for r in range(args.rounds):
                for i, n in enumerate(args.pages):
                    t0, cpu0 = time.time(), time.process_time()
                    cpu.start()
                    res = asyncio.run(watch(url, args.mode, n, args.seconds, seed=100 * r + i))
                    res["pages_cpu_share_of_2_cores"] = round((time.process_time() - cpu0) / (time.time() - t0) / 2, 3)
                    res["cpu"] = cpu.stop()
                    res.update(round=r, t0=t0, t1=time.time())
                    phases.append(res)
                phases.append(baseline_phase(args.seconds, cpu))
            spans = step_spans(metrics)  # read once, after the phases: each phase gets its steps from it
            for ph in phases:
                ph.update(step_fields(spans, ph["t0"], ph["t1"]))
        finally:
            if trainer is not None:
                stop_app(trainer)  # SIGINT: the CLI stops its run and exits
            stop_app(proc)
    result = {
        "what": f"{args.mode} polls from N simulated pages during training ({args.model} model), each every "
        f"{PERIOD_S} s or at the longer period the server sets (poll_period_s)",
        "machine": {"cores": os.cpu_count()},
        "seconds_per_phase": args.seconds,
        "pages_priority": args.pages_priority,
        "training": args.training,
        "poll_budget": budget_from_env(),  # the app inherits this environment
        "max_poll_s": max_period_from_env(),
        "rounds": args.rounds,
        "phases": with_slowdowns(phases),
        "summary": summary(phases, args.pages),
        "lockin": {str(n): lockin_slowdown(spans, phases, n) for n in args.pages},
        "command": "python bench/watchers.py " + " ".join(sys.argv[1:]),
    }
    emit(result, args.out)


def baseline_phase(seconds: float, cpu: CpuMeter) -> dict:
    t0 = time.time()
    cpu.start()
    time.sleep(seconds)
    return {"pages": 0, "t0": t0, "cpu": cpu.stop(), "t1": time.time()}


class CpuMeter:
    """CPU time over a phase, in cores (CPU seconds per wall second): the app's server process (its own threads,
    not its children), the training (the app's child processes, or a thread of the server with --training
    app-thread), and the host's steal time (CPU the hypervisor gave to other machines: this host's speed drift).
    The server's share in a page phase minus a baseline's is what the pages cost it, a figure the step-time
    noise does not blur."""

    def __init__(self, pid: int):
        import psutil

        self.psutil, self.app = psutil, psutil.Process(pid)
        self._t0 = self._c0 = None

    def _read(self) -> dict:
        def total(p):
            try:
                t = p.cpu_times()
                return t.user + t.system
            except self.psutil.Error:
                return 0.0

        kids = self.app.children(recursive=True)
        return {"server": total(self.app), "training": sum(total(k) for k in kids), "steal": self.psutil.cpu_times().steal}

    def start(self) -> None:
        self._t0, self._c0 = time.time(), self._read()

    def stop(self) -> dict:
        now, c1 = time.time(), self._read()
        wall = max(1e-9, now - self._t0)
        # a child that ended in the phase takes its CPU time with it: the training share is then a lower bound
        return {f"{k}_cores": round(max(0.0, c1[k] - self._c0[k]) / wall, 4) for k in c1}


def with_slowdowns(phases: list[dict]) -> list[dict]:
    """Each page phase gets `baseline_s` (the mean median step of the baseline phases just before and after
    it) and `training_slowdown` against it; the same per generated token (`baseline_ms_per_token`,
    `training_slowdown_per_token`)."""
    for i, ph in enumerate(phases):
        if ph["pages"] == 0:
            continue
        before = next((p for p in reversed(phases[:i]) if p["pages"] == 0), None)
        after = next((p for p in phases[i + 1 :] if p["pages"] == 0), None)
        for key, base_key, slow_key in (
            ("step_s_median", "baseline_s", "training_slowdown"),
            ("ms_per_token", "baseline_ms_per_token", "training_slowdown_per_token"),
        ):
            around = [p[key] for p in (before, after) if p and p.get(key)]
            ph[base_key] = round(statistics.mean(around), 3) if around else None
            if ph[base_key] and ph.get(key):
                ph[slow_key] = round(ph[key] / ph[base_key] - 1, 3)
    return phases


# Student-t 0.975 quantiles by degrees of freedom; past 30, 2.042 (30's) is slightly wide (60: 2.000)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
       20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
       29: 2.045, 30: 2.042}


def mean_ci95(xs: list[float]) -> list[float] | None:
    """Student-t 95% interval of the mean of `xs` (the rounds' slowdowns), None with fewer than two."""
    if len(xs) < 2:
        return None
    half = T95.get(len(xs) - 1, T95[30]) * statistics.stdev(xs) / math.sqrt(len(xs))
    m = statistics.mean(xs)
    return [round(m - half, 3), round(m + half, 3)]


def lockin_slowdown(spans: list[tuple[float, float, float]], phases: list[dict], n: int) -> dict | None:
    """The pages' slowdown of training by every step, not only those inside one phase, robust to the host's drift.

    A page phase and a baseline alternate every `--seconds` (a lock-in: the load is switched on and off much
    faster than the host's speed drifts). Each step gets `f`, the share of its duration under N pages, and
    `y` = log(seconds per generated token). Both are taken relative to their means over the steps within
    one cycle either side (a page phase and a baseline: the local mean of `f` is then near 1/2 and the local
    mean of `y` follows the drift), and the slope of y on f by least squares is the log of the step's
    slowdown with the pages on for all of it: `slowdown` = exp(slope) - 1. Steps that straddle a phase
    boundary count for their share (no step is dropped for not fitting a window, which with steps half a
    phase long favours short steps). Steps overlapping another N's page phases are left out. The 95%
    interval is a delete-one-cycle jackknife (cycles: from one N-page phase's start to the next), Student-t
    on the cycles' count."""
    mine = [(p["t0"], p["t1"]) for p in phases if p["pages"] == n]
    other = [(p["t0"], p["t1"]) for p in phases if p["pages"] not in (0, n)]
    if len(mine) < 2:
        return None

    def cover(a, b, wins):
        return sum(max(0.0, min(b, w1) - max(a, w0)) for w0, w1 in wins) / (b - a)

    starts = sorted(w0 for w0, _ in mine)
    cycle = (starts[-1] - starts[0]) / (len(starts) - 1)
    lo, hi = min(p["t0"] for p in phases), max(p["t1"] for p in phases)
    pts = []  # (midpoint, cycle index, f, y)
    for a, b, tokens in spans:  # the steps inside the phases (not the warm-up step before them)
        if b <= a or tokens <= 0 or a < lo or b > hi or cover(a, b, other) > 0:
            continue
        mid = 0.5 * (a + b)
        pts.append((mid, sum(st <= mid for st in starts), cover(a, b, mine), math.log((b - a) / tokens)))

    def slope(ps):
        sxy = sxx = 0.0
        for mid, _, f, y in ps:
            near = [(f2, y2) for m2, _, f2, y2 in ps if abs(m2 - mid) <= cycle]
            fm, ym = statistics.mean(f2 for f2, _ in near), statistics.mean(y2 for _, y2 in near)
            sxy += (f - fm) * (y - ym)
            sxx += (f - fm) ** 2
        return sxy / sxx if sxx > 0 else None

    b = slope(pts)
    if b is None:
        return None
    blocks = sorted({c for _, c, _, _ in pts})
    jack = [x for x in (slope([p for p in pts if p[1] != c]) for c in blocks) if x is not None]
    out = {"steps": len(pts), "cycles": len(blocks), "cycle_s": round(cycle, 1), "slowdown": round(math.exp(b) - 1, 4)}
    if len(jack) >= 2:
        k, jm = len(jack), statistics.mean(jack)
        se = math.sqrt((k - 1) / k * sum((x - jm) ** 2 for x in jack))
        t = T95.get(k - 1, T95[30])
        out["ci95"] = [round(math.exp(b - t * se) - 1, 4), round(math.exp(b + t * se) - 1, 4)]
    return out


def summary(phases: list[dict], pages: list[int]) -> dict:
    """Per N: every answer's errors and latency quantiles over its rounds, and the mean slowdown."""
    base = [s for p in phases if p["pages"] == 0 for s in p["step_s"]]

    def cores(ps, key):  # mean CPU cores over the phases `ps` (CpuMeter)
        xs = [p["cpu"][key] for p in ps if p.get("cpu")]
        return round(statistics.mean(xs), 4) if xs else None

    baselines = [p for p in phases if p["pages"] == 0]
    out = {
        "baseline": {
            "step_s_median": median(base),
            "steps": len(base),
            **{f"{k}_cores": cores(baselines, f"{k}_cores") for k in ("server", "training", "steal")},
        }
    }
    for n in pages:
        mine = [p for p in phases if p["pages"] == n]
        slow = [p["training_slowdown"] for p in mine if p.get("training_slowdown") is not None]
        per_token = [p["training_slowdown_per_token"] for p in mine if p.get("training_slowdown_per_token") is not None]
        out[str(n)] = {
            "answers": sum(p["answers"] for p in mine),
            "errors": sum(p["errors"] for p in mine),
            "p95_s_worst_round": max((p["p95_s"] for p in mine if p["p95_s"] is not None), default=None),
            "steady_p95_s_worst_round": max(
                (p["steady"]["p95_s"] for p in mine if p.get("steady", {}).get("p95_s") is not None), default=None
            ),
            "client_loop_lag_p95_s_worst_round": max(
                (p["client_loop_lag"]["p95_s"] for p in mine if p.get("client_loop_lag", {}).get("p95_s") is not None),
                default=None,
            ),
            "step_s_median": median([s for p in mine for s in p["step_s"]]),
            "training_slowdown_per_round": slow,
            "training_slowdown_mean": round(statistics.mean(slow), 3) if slow else None,
            "training_slowdown_ci95": mean_ci95(slow),
            "training_slowdown_per_token_per_round": per_token,
            "training_slowdown_per_token_mean": round(statistics.mean(per_token), 3) if per_token else None,
            "training_slowdown_per_token_ci95": mean_ci95(per_token),
            "training_slowdown_per_token_median": median(per_token),
            **{f"{k}_cores": cores(mine, f"{k}_cores") for k in ("server", "training", "steal")},
        }
        srv, srv0 = out[str(n)]["server_cores"], out["baseline"]["server_cores"]
        # what the pages cost the server, in cores: its share with the pages minus without them
        out[str(n)]["server_cores_for_pages"] = round(srv - srv0, 4) if srv is not None and srv0 is not None else None
        # the CPU the training did not get with the pages open, as a share of what it got without them: a
        # slowdown figure the host's speed drift does not move (the step times above do move with it)
        tr, tr0 = out[str(n)]["training_cores"], out["baseline"]["training_cores"]
        out[str(n)]["training_cpu_drop"] = round(1 - tr / tr0, 4) if tr is not None and tr0 else None
    return out


if __name__ == "__main__":
    main()
