"""Charts, run pickers, error pages and the API docs in a real browser, with every request off this machine refused.

Debian's chromium under Playwright against a real ``deltabench serve`` on a fresh SQLite file. The page's context
aborts any request that does not go to the server (``context.route``), so a chart or the docs page that needs a
CDN renders nothing and the test fails. Screenshots go to ``test-artifacts/web/`` (gitignored).
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import re
from collections.abc import Iterator

import httpx
import pytest
from processes import serve_dashboard

from deltabench.harness.document import WorkFigures

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
UTC = dt.timezone.utc
IMPLS = {"torch_chunk": 2.0, "triton_chunk": 1.0, "jax_chunk": 3.0}  # fwd medians at T=64 (ms); torch the baseline


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """``deltabench serve`` on a fresh SQLite file and a free port: (base URL, write token)."""
    db = tmp_path_factory.mktemp("charts") / "serve.db"
    with serve_dashboard(db, "charts") as (base, token):
        yield base, token


def _job(build, impl: str, mode: str, T: int, median: float, **kw):  # type: ignore[no-untyped-def]
    job = build.job(impl=impl, mode=mode, T=T, median=median, n=30, **kw)
    if job.status == "ok":
        flops, nbytes, s = 4e6 * T, 1e5 * T, median / 1e3
        job.work = WorkFigures(flops=flops, bytes=nbytes, tflops=flops / s / 1e12, gbps=nbytes / s / 1e9)
    return job


HISTORY = 4  # same-code runs before the base: with the base, the five a series needs to give its spread


@pytest.fixture(scope="module")
def runs(server, build) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Runs of gdn (three impls x fwd, fwd+bwd x two shapes, one incorrect job): four same-code runs of history,
    the base (`suite-0`) and the head (`suite-1`), in which triton_chunk is 30% slower. The history gives the
    comparison its run-to-run spread (without it a 30% step on one run each is within noise). All carry the
    machine's ceilings."""
    base_url, token = server
    docs = []
    steps = (1.0,) * HISTORY + (1.0, 1.3)
    for i, slow in enumerate(steps):
        jobs = [
            _job(
                build,
                impl,
                mode,
                T,
                median * (slow if impl == "triton_chunk" else 1) * (3 if mode != "fwd" else 1) * T / 64,
            )
            for impl, median in IMPLS.items()
            for mode in ("fwd", "fwd+bwd")
            for T in (64, 256)
        ]
        jobs.append(_job(build, "jax_chunk", "fwd", 1000, 1.0, status="incorrect"))
        doc = build.document(
            jobs=jobs,
            created_at=dt.datetime.now(UTC) - dt.timedelta(days=len(steps) - i),
            commit=f"{i + 7:040x}",
        ).model_copy(update={"ceilings": {"matmul_tflops": 2.0, "copy_gbps": 50.0, "matmul_dtype_bits": 32.0}})
        doc.suite = f"history-{i}" if i < HISTORY else f"suite-{i - HISTORY}"
        docs.append(doc)
    r = httpx.post(
        f"{base_url}/api/v1/runs", json=build.body(*docs), headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    assert r.status_code == 201, r.text
    return {"old": docs[-2].run_id, "new": docs[-1].run_id}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium, headless, under Playwright."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser, server):  # type: ignore[no-untyped-def]
    """A page whose every request off the server is aborted, and listed in ``page.refused``."""
    base_url, _ = server
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    refused: list[str] = []

    def gate(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.url.startswith(base_url + "/"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", gate)
    pg = context.new_page()
    pg.refused = refused  # type: ignore[attr-defined]
    yield pg
    assert refused == [], "the page asked for something off the server"
    context.close()


def _shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _drawn(page, chart_id: str):  # type: ignore[no-untyped-def]
    """The chart's element once Plotly has drawn its SVG into it."""
    page.wait_for_selector(f"#{chart_id} .main-svg", timeout=20_000)
    return page.locator(f"#{chart_id}")


def _legend(chart) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.strip() for t in chart.locator(".legend .traces .legendtext").all_text_contents()]


def test_run_page_draws_bars_roofline_and_speedups(server, runs, page) -> None:  # type: ignore[no-untyped-def]
    base_url, _ = server
    page.goto(f"{base_url}/runs/{runs['new']}")
    assert (
        page.locator("#ceilings").inner_text() == "matmul 2 TFLOP/s · copy 50 GB/s (read+write) · matmul dtype 32 bit"
    )
    bars = _drawn(page, "chart-bars-gdn")
    # A bar trace per impl and mode (fwd, fwd+bwd panels), two shapes each; the incorrect job is not drawn.
    assert bars.locator(".barlayer .trace").count() == 6
    assert bars.locator(".barlayer .point").count() == 12
    assert bars.locator(".errorbar").count() == 12, "every bar has its IQR whisker"
    assert _legend(bars) == list(IMPLS)
    text = bars.text_content()
    assert "fwd+bwd" in text and "median ms (CPU)" in text
    roofline = _drawn(page, "chart-roofline")
    assert roofline.locator(".scatterlayer .trace").count() == 3 + 2, "a trace per impl and the two roofs"
    assert roofline.locator(".scatterlayer .point").count() == 12
    text = roofline.text_content()
    assert "arithmetic intensity (FLOP/byte)" in text and "achieved TFLOP/s" in text
    assert _legend(roofline)[-2:] == ["copy ceiling 50 GB/s", "matmul ceiling 2 TFLOP/s"]
    speedup = _drawn(page, "chart-speedup-gdn")
    assert _legend(speedup) == ["triton_chunk", "jax_chunk", "torch_chunk (baseline, 1×)"]
    assert speedup.locator(".scatterlayer .trace").nth(0).locator(".point").count() == 4
    assert "speedup vs torch_chunk" in speedup.text_content()
    # The log axis labels its own 1-2-5 ticks, never plotly's minor ones (3, 4, 6 times a decade).
    labels = speedup.locator(".ytick text").all_text_contents()
    assert "1×" in labels and "2×" in labels, labels
    assert all(label.rstrip("×").replace("0.", "").lstrip("0") in ("1", "2", "5", "10") for label in labels), labels
    _shot(page, "run-charts")


def test_compare_page_picks_runs_and_draws_ratios_with_intervals(server, runs, page) -> None:  # type: ignore[no-untyped-def]
    base_url, _ = server
    page.goto(f"{base_url}/compare")
    form = page.locator("#compare-runs")
    base, head = form.locator("select[name=base]"), form.locator("select[name=head]")
    assert base.locator("option").count() == 1 + HISTORY + 2, "a placeholder and every run"
    # The filter box narrows the lists to matching runs.
    form.locator("input.run-filter").fill("suite-0")
    visible = base.locator("option:not([hidden])")
    assert visible.count() == 2 and runs["old"][:12] in visible.nth(1).inner_text()
    form.locator("input.run-filter").fill("")
    base.select_option(runs["old"])
    head.select_option(runs["new"])
    form.locator("button").click()
    page.wait_for_url(re.compile(r"/compare\?base="))
    assert page.locator("#comparison tbody tr").count() == 13, "twelve timed jobs and the incorrect one"
    ratios = _drawn(page, "chart-ratios")
    legend = _legend(ratios)
    assert "regression" in legend
    slow = ratios.locator(".scatterlayer .trace").nth(legend.index("regression"))
    assert slow.locator(".point").count() == 4, "triton_chunk's four cases, 30% slower"
    assert slow.locator(".errorbar").count() == 4, "each with its interval"
    assert "head / base median" in ratios.text_content()
    # The pickers keep the runs chosen.
    assert page.locator("#compare-runs select[name=base]").input_value() == runs["old"]
    _shot(page, "compare-charts")
    # Two impls of one run, picked the same way.
    page.locator("#compare-impls select[name=run]").select_option(runs["new"])
    page.locator("#compare-impls input[name=base_impl]").fill("torch_chunk")
    page.locator("#compare-impls input[name=head_impl]").fill("triton_chunk")
    page.locator("#compare-impls button").click()
    page.wait_for_url(re.compile(r"/compare\?run="))
    assert _drawn(page, "chart-ratios").locator(".scatterlayer .point").count() == 4


def test_api_docs_render_every_operation_offline(server, page) -> None:  # type: ignore[no-untyped-def]
    base_url, _ = server
    spec = httpx.get(f"{base_url}/api/v1/openapi.json").json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    page.goto(f"{base_url}/api/v1/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.locator(".opblock").count() == operations > 10
    assert "/api/v1/runs" in page.locator(".opblock-summary-path").all_inner_texts()
    assert "deltabench" in page.locator(".info .title").inner_text()
    _shot(page, "api-docs")


def test_page_errors_are_pages_and_api_errors_stay_json(server, runs, page) -> None:  # type: ignore[no-untyped-def]
    base_url, _ = server
    for url, status, reason in [
        ("/?page=abc", 422, "page: Input should be a valid integer"),
        ("/compare?threshold=-1", 422, "threshold: Input should be greater than or equal to 0"),
        ("/runs/no-such-run", 404, "no-such-run"),
        ("/no/such/page", 404, "Not Found"),
    ]:
        response = page.goto(base_url + url)
        assert response.status == status, url
        assert response.headers["content-type"].startswith("text/html"), url
        assert page.locator("h1").inner_text() == f"Error {status}"
        assert reason in page.locator("#error-detail").inner_text(), url
        assert page.locator("header nav a").count() >= 6, "the error page keeps the navigation"
    _shot(page, "error-422")
    api = httpx.get(f"{base_url}/api/v1/runs?limit=abc", headers={"Accept": "text/html"})
    assert api.status_code == 422 and api.json()["detail"][0]["loc"] == ["query", "limit"]


def test_every_other_page_renders_offline(server, runs, page) -> None:  # type: ignore[no-untyped-def]
    base_url, _ = server
    for url, marker in [("/", "#runs"), ("/jobs", "#submit-job"), ("/regressions", "h1"), ("/history", "#series")]:
        response = page.goto(base_url + url)
        assert response.status == 200 and page.locator(marker).count() >= 1, url
    page.locator("a.series-link", has_text="triton_chunk / B2-T64").first.click()
    history = _drawn(page, "history-plot")
    assert history.locator(".scatterlayer .trace").count() == 3, "the IQR band's two edges and the median"
    assert history.locator(".scatterlayer .trace").nth(2).locator(".point").count() == HISTORY + 2, "one point per run"
    assert "median ms" in history.text_content()


def test_history_hover_shows_stored_markup_as_typed(server, build, page) -> None:  # type: ignore[no-untyped-def]
    """A host or commit holding HTML (Plotly renders a subset of it in labels) reads as typed in the hover, with no
    bold text or link made of it."""
    base_url, token = server
    host, commit = "<b>bold-host</b><a href='https://example.com'>link</a>", "<i>c0mm1t</i>"
    docs = []
    for i in range(2):
        doc = build.document(
            jobs=[_job(build, "torch_recurrent", "fwd", 64, 1.0 + i)],
            created_at=dt.datetime.now(UTC) - dt.timedelta(hours=2 - i),
            commit=commit,
        )
        doc.environment = doc.environment.model_copy(update={"host": host})
        doc.suite = "markup"
        docs.append(doc)
    r = httpx.post(f"{base_url}/api/v1/runs", json=build.body(*docs), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    page.goto(base_url + "/history")
    page.locator("a.series-link", has_text="torch_recurrent / B2-T64").first.click()
    _drawn(page, "history-plot")
    page.evaluate("Plotly.Fx.hover('history-plot', [{curveNumber: 2, pointNumber: 0}])")
    page.wait_for_selector("#history-plot .hoverlayer .hovertext", timeout=10_000)
    hover = page.locator("#history-plot .hoverlayer")
    text = hover.text_content()
    assert "<b>bold-host</b><a href='https://example.com'>link</a>" in text, text
    assert "<i>c0mm1t" in text, text
    assert hover.locator("a").count() == 0, "a stored link became a link"
    assert hover.locator("tspan[style*='bold']").count() == 0, "stored markup became bold text"


def test_a_refused_streamed_write_gets_its_status_through_urllib(server) -> None:  # type: ignore[no-untyped-def]
    """A 5 MiB body streamed with a bogus token: the server refuses it before the app reads it, and reads and drops
    the rest first, so a client still sending (Python's urllib) sees the 403 rather than a closed connection."""
    import urllib.error
    import urllib.request

    base_url, _ = server

    def chunks() -> Iterator[bytes]:
        for _ in range(80):
            yield b"x" * 65536

    request = urllib.request.Request(
        f"{base_url}/api/v1/runs",
        data=chunks(),
        method="POST",
        headers={
            "Authorization": "Bearer bogus",
            "Content-Type": "application/json",
            "Content-Length": str(80 * 65536),
        },
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403
    assert "token" in refused.value.read().decode()
