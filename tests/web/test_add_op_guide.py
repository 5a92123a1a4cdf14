"""docs/guide/add-op.md's "A worked example", followed word for word through every command and page.

The op file is the guide's Python blocks joined in order, the suite its TOML block, and the commands its shell
block (the one that serves): ``verify``, two ``run``s, ``gate``, ``ingest`` and ``serve``, each run as a user's shell
would in a fresh directory, with a per-test SQLite store in ``$DELTABENCH_DB``. Only ``serve`` gets options the
guide leaves out (a free port, no local worker). The walk ends on the dashboard's comparison page showing the two
runs of the op compared, and the run page titled from the op's contract.

A store that holds runs of the op, read without the file, must say how to load it ("unknown op 'cumdecay': ...
--import FILE or install its deltabench.ops entry point"): ``ingest`` exit code 2, ``POST /api/v1/runs`` 422, the
comparison (page and API) 422, never the note that jobs were "stored by an older version".
"""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from processes import serve_dashboard

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "add-op.md"
REMEDY = "or install its deltabench.ops entry point"


def worked_example(guide: str) -> str:
    """The guide's "A worked example" section."""
    return guide.split("## A worked example", 1)[1].split("\n## ", 1)[0]


def blocks(section: str, lang: str) -> list[str]:
    """The section's fenced code blocks in `lang`, in order."""
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The guide's files written and its commands run up to ``serve``: the directory, store, run ids, outputs."""
    section = worked_example(GUIDE.read_text())
    tmp = tmp_path_factory.mktemp("add-op")
    (tmp / "cumdecay_op.py").write_text("\n\n".join(blocks(section, "python")))
    [suite] = blocks(section, "toml")
    (tmp / "my-cumdecay.toml").write_text(suite)
    [commands] = [b for b in blocks(section, "bash") if "deltabench serve" in b]
    lines = [shlex.split(line) for line in commands.splitlines() if line.strip()]
    assert [words[1] for words in lines] == ["verify", "run", "run", "gate", "ingest", "serve"], lines
    assert all("--import" in words for words in lines), "every command of the guide takes the op file"
    store = tmp / "store.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTABENCH_")}
    env["DELTABENCH_DB"] = str(store)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs: dict[str, str] = {}
    for words in lines[:-1]:
        done = subprocess.run(words, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        # Two runs with no history: the gate answers UNKNOWN (exit 3), or a regression (1) or SAME (0) where the
        # samples alone tell; any other command must succeed.
        assert done.returncode in ((0, 1, 3) if words[1] == "gate" else (0,)), (words, done.stdout, done.stderr)
        outputs[words[1]] = done.stdout
    run_ids = outputs["ingest"].split()
    assert len(run_ids) == 2, outputs["ingest"]
    return {"tmp": tmp, "store": store, "env": env, "runs": run_ids, "serve": lines[-1]}


def test_the_guides_op_ends_compared_on_the_dashboard(walk: dict) -> None:
    # The guide's own options of serve (--import cumdecay_op.py), its file named from the guide's directory.
    serve_args = [str(walk["tmp"] / w) if w.endswith(".py") else w for w in walk["serve"][2:]]
    with serve_dashboard(walk["store"], "guide", args=serve_args) as (base, _token):
        base_run, head_run = walk["runs"]
        page = httpx.get(f"{base}/compare", params={"base": base_run, "head": head_run}, timeout=30)
        assert page.status_code == 200, page.text[-2000:]
        rows = re.findall(r"<tr class=\"o-[^\"]*\">\s*<td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>", page.text)
        assert rows == [("cumdecay", "torch_loop", "B2-T64-D8")], rows
        assert "older version" not in page.text
        run_page = httpx.get(f"{base}/runs/{head_run}", timeout=30)
        assert run_page.status_code == 200
        assert "Decayed cumulative sum" in run_page.text  # the title of the op's contract, not its name twice
        api = httpx.get(f"{base}/api/v1/compare/runs", params={"base": base_run, "head": head_run}, timeout=30)
        assert api.status_code == 200 and [r["op"] for r in api.json()["rows"]] == ["cumdecay"], api.text


def test_without_the_op_file_every_reader_says_how_to_load_it(walk: dict) -> None:
    tmp, env = walk["tmp"], walk["env"]
    ingest = subprocess.run(
        ["deltabench", "ingest", "base.json"], cwd=tmp, env=env, capture_output=True, text=True, timeout=120
    )
    assert ingest.returncode == 2
    assert ingest.stderr.strip().splitlines() == [
        f"deltabench: error: base.json: unknown op 'cumdecay': give the command --import FILE {REMEDY}"
    ]
    document = (tmp / "base.json").read_text()
    with serve_dashboard(walk["store"], "bare") as (base, token):
        stored = httpx.post(
            f"{base}/api/v1/runs",
            content=f'{{"documents": [{document}]}}',
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=30,
        )
        reason = f"unknown op 'cumdecay': start the server with --import FILE {REMEDY}"
        assert stored.status_code == 422 and reason in stored.text, stored.text
        base_run, head_run = walk["runs"]
        for path in ("/compare", "/api/v1/compare/runs"):
            answer = httpx.get(f"{base}{path}", params={"base": base_run, "head": head_run}, timeout=30)
            assert answer.status_code == 422 and reason in html.unescape(answer.text), (
                path,
                answer.status_code,
                answer.text[-800:],
            )
            assert "older version" not in answer.text
        run_page = httpx.get(f"{base}/runs/{head_run}", timeout=30)
        assert run_page.status_code == 200 and reason in html.unescape(run_page.text)
        assert "cumdecay cumdecay" not in run_page.text
