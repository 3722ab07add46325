"""What one page request costs the server: the median time of each Train-tab event a page sends, on an idle
server, after a finished run (so the answers carry a whole run's charts and a recorded step).

    python bench/request_cost.py [--n 120] [--out assets/request_cost.json]

The app is built in this process on a temporary runs folder (127.0.0.1, a free port), trains the tests'
tiny random model for 15 + 15 steps through /start (the tests' `start_args`; seconds), and then sends each event
`--n` times the way a page does (one GET of the live view's route, `/grpo_app/<name>`, for the same page;
before 2026-11-25 one POST to `/gradio_api/run/<name>`), and the /status API (one POST through Gradio's
pipeline) for scale; the first 20 are not counted. On an idle machine the time from request to answer is the server's CPU time for it, which
is what every page's request takes from a training that runs beside it (docs/performance.md). Run it on
an otherwise idle machine; it prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import emit  # noqa: E402
from bench.watchers import Page  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=120, help="requests per event (the first 20 are warm-up)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.n <= 20:
        ap.error("--n must be above 20 (the first 20 requests are not counted)")

    import httpx
    from gradio_client import Client

    from grpo_app.ui import app as ui_app
    from tests.app_server import free_port, start_args

    with tempfile.TemporaryDirectory(prefix="request-cost-") as tmp:
        demo = ui_app.build_app(
            runs_dir=Path(tmp) / "runs", configs_dir=ROOT / "tests/configs/app", default_preset="tiny-app"
        )
        port = free_port()
        demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
        url = f"http://127.0.0.1:{port}"
        try:
            Client(url, verbose=False).predict(*start_args(), api_name="/start")
            demo.studio.manager.wait(600)
            steps = len(demo.studio.view()["metrics"])
            page = Page(url, "page")
            # the page's three live-view requests (plain routes since 2026-11-25, ui/live.py), and for scale one
            # unqueued Gradio event, the /status API (one POST through Gradio's pipeline, as every page request
            # was before)
            events = {"poll": page.poll, **{ep.name: ep for ep in page.draws.values()}}
            status_ep = Page(url, "status").poll
            result = {}
            with httpx.Client(timeout=30) as client:
                for name, ep in [*events.items(), ("gradio_status", status_ep)]:
                    times, size = [], 0
                    for _ in range(args.n):
                        t0 = time.perf_counter()
                        if name == "gradio_status":
                            r = client.post(f"{url}/gradio_api/run/{ep.name}", json=ep.body("bench-page"))
                        else:
                            r = client.get(f"{url}/grpo_app/{ep.name}", params=ep.query("bench-page"))
                        times.append(time.perf_counter() - t0)
                        if r.status_code != 200 or "error" in r.json():
                            raise SystemExit(f"{name}: {r.status_code} {r.text[:200]}")
                        size = len(r.content)
                    result[name] = {
                        "median_ms": round(statistics.median(times[20:]) * 1000, 2),
                        "p90_ms": round(sorted(times[20:])[int(0.9 * (args.n - 20))] * 1000, 2),
                        "answer_bytes": size,
                    }
        finally:
            demo.close()
    emit(
        {
            "what": "server time per Train-tab request on an idle server, after a finished run",
            "run_steps": steps,
            "requests_per_event": args.n,
            "events": result,
            "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
