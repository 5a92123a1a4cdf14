"""The pages in a real browser: Debian's chromium driven by Playwright against a real ``deltabench serve``.

Screenshots go to ``test-artifacts/web/`` at the repository root (gitignored, kept by CI as artifacts).
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from processes import serve_dashboard

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, str, pathlib.Path]]:  # type: ignore[no-untyped-def]
    """``deltabench serve`` on a fresh SQLite file and a free port: (base URL, write token, db path)."""
    db = tmp_path_factory.mktemp("browser") / "serve.db"
    with serve_dashboard(db, "browser") as (base, token):
        yield base, token, db


@pytest.fixture(scope="module")
def seeded(server, build) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Twenty runs posted through the API: torch_chunk steps 20% slower at run 12; a failing triton job."""
    base, token, _ = server
    start = dt.datetime.now(UTC) - dt.timedelta(days=20)
    docs = []
    for i in range(20):
        median = (2.0 if i < 12 else 2.4) * (1 + 0.003 * ((i * 7) % 3 - 1))
        jobs = [
            build.job(impl="torch_chunk", median=median),
            build.job(impl="triton_chunk", median=0.8),
            build.job(impl="triton_chunk", T=4096, status="incorrect"),
            build.job(impl="torch_chunk", T=4096, median=6.0),
        ]
        docs.append(build.document(created_at=start + dt.timedelta(days=i), commit=f"{i + 1:040x}", jobs=jobs))
    r = httpx.post(
        f"{base}/api/v1/runs", json=build.body(*docs), headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    assert r.status_code == 201, r.text
    # The server refreshes the regressions table in the background after the ingest: wait until it has.
    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/api/v1/regressions", timeout=60).json()["pending_series"]:
        assert time.monotonic() < deadline, "the regressions table was not refreshed after the ingest"
        time.sleep(0.1)
    return {"first": docs[0].run_id, "before_step": docs[11].run_id, "last": docs[-1].run_id}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium, headless, under Playwright."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    """A fresh page that records any request leaving the server (the dashboard must work offline)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.external_requests = []  # type: ignore[attr-defined]
    pg.on(
        "request",
        lambda req: None if req.url.startswith("http://127.0.0.1") else pg.external_requests.append(req.url),  # type: ignore[attr-defined]
    )
    yield pg
    context.close()


def _shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_runs_run_compare_history_regressions(server, seeded, page) -> None:  # type: ignore[no-untyped-def]
    base, _, _ = server
    page.goto(f"{base}/")
    assert page.locator("#runs tbody tr").count() == 20
    _shot(page, "runs")
    # Open the newest run from the list.
    page.locator("a.run-link").first.click()
    page.wait_for_url(re.compile(r"/runs/"))
    assert seeded["last"][:12] in page.locator("h1").inner_text()
    pivot = page.locator("#op-gdn table.pivot")
    assert pivot.count() == 1
    assert "(baseline)" in pivot.locator("thead").inner_text()
    assert page.locator("td.s-incorrect .reason").first.inner_text().startswith("grad:q rel_fro")
    page.locator("td.s-incorrect details summary").first.click()
    assert "grad:q" in page.locator("td.s-incorrect ul.checks").first.inner_text()
    _shot(page, "run")
    # Compare the newest run (head) against the last one before the step (base): its 12 runs of history set the
    # run-to-run bound (against the oldest run alone, a CPU gate has no history and 20% is within noise).
    page.goto(f"{base}/compare?base={seeded['before_step']}&head={seeded['last']}")
    rows = page.locator("#comparison tbody tr")
    assert rows.count() == 4
    regression = page.locator("#comparison tr.o-bad").first
    assert "torch_chunk" in regression.inner_text() and "regression" in regression.inner_text()
    assert re.search(r"\[1\.\d+, 1\.\d+\]", regression.inner_text()), "ratio interval shown"
    _shot(page, "compare")
    # The series history: the Plotly chart renders (served by the app), with the change point marked.
    page.goto(f"{base}/history")
    page.locator("a.series-link", has_text="torch_chunk / B2-T1024").click()
    page.wait_for_selector("#history-plot .main-svg", timeout=20_000)
    assert page.locator("#history-plot .scatterlayer .trace").count() >= 2
    assert page.locator("#change-points tbody tr").count() == 1
    assert "+20" in page.locator("#history-plot").inner_text()
    _shot(page, "history")
    page.goto(f"{base}/regressions?only_regressions=true")
    assert page.locator("#regressions tbody tr").count() == 1
    _shot(page, "regressions")
    assert page.external_requests == []


def test_annotate_a_change_point(server, seeded, page) -> None:  # type: ignore[no-untyped-def]
    base, token, _ = server
    page.goto(f"{base}/regressions")
    form = page.locator("#regressions form").first
    form.locator("select[name=kind]").select_option("expected")
    form.locator("input[name=note]").fill("<b>new masking</b>")
    form.locator("input[name=token]").fill(token)
    # the page is at /regressions before the click already: wait for the submission's own navigation, or the
    # row is read before the annotation is stored
    with page.expect_navigation(url=re.compile(r"/regressions$")):
        form.locator("button").click()
    cell = page.locator("#regressions tbody tr").first
    assert "<b>new masking</b>" in cell.inner_text(), "the note shows as text, escaped"
    assert cell.locator("b").count() == 0


def test_submit_form_refuses_a_bad_token(server, page) -> None:  # type: ignore[no-untyped-def]
    base, _, _ = server
    page.goto(f"{base}/jobs")
    page.locator("#submit-job select[name=suite]").select_option("smoke")
    page.locator("#submit-job input[name=token]").fill("dbt_wrong")
    page.locator("#submit-job button").click()
    assert "unknown or revoked" in page.locator("#form-error").inner_text()


def test_job_submitted_from_the_form_runs_and_shows_up(server, page) -> None:  # type: ignore[no-untyped-def]
    base, token, _ = server
    page.goto(f"{base}/jobs")
    page.locator("#submit-job select[name=suite]").select_option("smoke")
    page.locator("#submit-job input[name=ops]").fill("gdn")
    page.locator("#submit-job input[name=impls]").fill("torch_recurrent")
    page.locator("#submit-job input[name=dtypes]").fill("fp32")
    page.locator("#submit-job input[name=modes]").fill("fwd")
    page.locator("#submit-job input[name=token]").fill(token)
    page.locator("#submit-job button").click()
    page.wait_for_url(re.compile(r"/jobs$"))
    job = page.locator("tr.job").first
    deadline = time.monotonic() + 150
    while job.get_attribute("data-status") not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"job still {job.get_attribute('data-status')}"
        time.sleep(1)
        page.reload()
        job = page.locator("tr.job").first
    _shot(page, "jobs")
    assert job.get_attribute("data-status") == "done", job.inner_text()
    job.locator("a.run-link").click()
    page.wait_for_url(re.compile(r"/runs/"))
    assert "torch_recurrent" in page.locator("#op-gdn").inner_text()
    _shot(page, "job-run")
