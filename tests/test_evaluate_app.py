"""The Evaluate tab: uploads unpacked safely (real zip files), the ``/evaluate`` API on the bundled
dataset checked against the run's own exported rows and an independent recount, bad input refused
in one line with the app still serving, and the tab driven in a real browser (pick, run, see the
aggregates, open a row in Chat).

One app for the module (the trained demo checkpoint, the app's default, so base vs adapter means
something), with a data folder of its own and small upload limits so a zip bomb is cheap to make."""

import io
import json
import re
import stat
import zipfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from gradio_client import Client, handle_file

from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, SampleResult, open_dataset, summarise
from g4v.evaluate import uploads
from g4v.settings.limits import limits
from tests.browser import browser_page
from tests.conftest import TEST_OUTPUT, running_app
from webapp.evaluate_equivalence import NO_FIELDS
from webapp.evaluate_tables import SAMPLE_HEADERS
from webapp.runs import PREVIOUS_RUN

#: The app's upload limits in this module (set through its environment).
APP_MAX_BYTES, APP_MAX_FILES = 4_000_000, 40
LIMIT = 8  # rows of the bundled dataset an API run covers: two pictures, all four question kinds
BUNDLED_ROWS = [json.loads(line) for line in (BUNDLED_DATASET / "metadata.jsonl").read_text().splitlines()]


def picture_bytes(row: int = 0) -> bytes:
    return (BUNDLED_DATASET / BUNDLED_ROWS[row]["file_name"]).read_bytes()


def make_zip(path: Path, entries: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    """A real zip: ``entries`` as files, ``links`` as symbolic-link entries (name -> target)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name, data in entries.items():
            zipped.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zipped.writestr(info, target)
    return path


def metadata(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def small_dataset(folder_name: str = "shapes") -> dict[str, bytes]:
    """Three rows of the bundled dataset in a folder of their own, as zip entries."""
    rows = [dict(BUNDLED_ROWS[i], file_name=f"images/{i}.png") for i in range(3)]
    entries = {f"{folder_name}/metadata.jsonl": metadata(rows)}
    entries.update({f"{folder_name}/images/{i}.png": picture_bytes(i) for i in range(3)})
    return entries


# ── uploads, without the app ───────────────────────────────────────────────────────────────────


def test_a_zipped_dataset_folder_unpacks_and_loads(tmp_path):
    archive = make_zip(tmp_path / "upload.zip", {**small_dataset(), "__MACOSX/shapes/._metadata.jsonl": b"junk",
                                                 "shapes/.DS_Store": b"junk"})
    into = tmp_path / "into"
    into.mkdir()
    source = uploads.extract_upload([archive], into)
    assert source == into / "shapes"
    assert not (into / "__MACOSX").exists() and not (into / "shapes" / ".DS_Store").exists()
    dataset = open_dataset(str(source), data_dirs=[into])
    assert len(dataset) == 3
    assert [dataset.sample(i).prompt for i in range(3)] == [row["prompt"] for row in BUNDLED_ROWS[:3]]
    assert dataset.sample(0).error is None


def test_a_table_with_its_pictures_unpacks_side_by_side(tmp_path):
    sent = tmp_path / "sent"
    sent.mkdir()
    rows = [dict(BUNDLED_ROWS[i], file_name=f"{i}.png") for i in range(2)]
    (sent / "questions.jsonl").write_bytes(metadata(rows))
    for i in range(2):
        (sent / f"{i}.png").write_bytes(picture_bytes(i))
    into = tmp_path / "into"
    into.mkdir()
    source = uploads.extract_upload(sorted(sent.iterdir()), into)
    assert source == into / "questions.jsonl"
    assert len(open_dataset(str(source), data_dirs=[into])) == 2


REFUSED_ZIPS = [
    ("zip slip", {"../evil.png": b"x"}, None, "leaves its folder"),
    ("deep zip slip", {"data/../../evil.png": b"x"}, None, "leaves its folder"),
    ("absolute path", {"/tmp/evil.png": b"x"}, None, "absolute path"),
    ("symbolic link", {"data/metadata.jsonl": b"{}\n"}, {"data/images/a.png": "/etc/passwd"}, "link"),
    ("not a picture", {"data/metadata.jsonl": b"{}\n", "data/run.sh": b"rm -rf /"}, None, "neither a picture"),
    ("no table", {"data/a.png": b"x"}, None, "no table"),
    ("two tables", {"a/metadata.jsonl": b"{}\n", "b/metadata.jsonl": b"{}\n"}, None, "2 tables"),
    ("backslash name", {"..\\evil.png": b"x"}, None, "unusual name"),
]


@pytest.mark.parametrize("entries, links, expected", [case[1:] for case in REFUSED_ZIPS],
                         ids=[case[0] for case in REFUSED_ZIPS])
def test_a_dangerous_zip_is_refused_in_one_line_and_writes_nothing_outside(tmp_path, entries, links, expected):
    archive = make_zip(tmp_path / "upload.zip", entries, links)
    into = tmp_path / "store" / "into"
    into.mkdir(parents=True)
    with pytest.raises(G4VError, match=expected) as refused:
        uploads.extract_upload([archive], into)
    assert "\n" not in str(refused.value) and str(tmp_path) not in str(refused.value)
    outside = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")} - {"upload.zip", "store", "store/into"}
    assert not [p for p in outside if not p.startswith("store/into/")]  # nothing escaped the folder


def test_a_zip_bomb_too_many_files_and_a_fake_zip_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("g4v.settings.limits._current", replace(limits(), max_dataset_bytes=1_000_000, max_dataset_files=10))
    into = tmp_path / "into"
    into.mkdir()
    bomb = make_zip(tmp_path / "bomb.zip", {"data/metadata.jsonl": b"{}\n", "data/big.png": bytes(5_000_000)})
    assert bomb.stat().st_size < 50_000  # small on the wire, five times the limit unpacked
    with pytest.raises(G4VError, match=r"unpacks to 5 MiB, the limit is 1 MiB"):
        uploads.extract_upload([bomb], into)
    many = make_zip(tmp_path / "many.zip", {f"data/{i}.png": b"x" for i in range(11)})
    with pytest.raises(G4VError, match="11 files, the limit is 10"):
        uploads.extract_upload([many], into)
    fake = tmp_path / "fake.zip"
    fake.write_text("not a zip at all")
    with pytest.raises(G4VError, match="not a zip file"):
        uploads.extract_upload([fake], into)
    with pytest.raises(G4VError, match="not both"):
        uploads.extract_upload([bomb, fake.with_suffix(".png")], into)
    assert list(into.iterdir()) == []


# ── the app ────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The app's --data-dir: a good small dataset with one bad row, and a table with a broken line."""
    root = tmp_path_factory.mktemp("data")
    (root / "tiny" / "images").mkdir(parents=True)
    rows = [dict(BUNDLED_ROWS[i], file_name=f"images/{i}.png") for i in range(2)]
    rows.append(dict(BUNDLED_ROWS[2], file_name="images/missing.png"))
    (root / "tiny" / "metadata.jsonl").write_bytes(metadata(rows))
    for i in range(2):
        (root / "tiny" / "images" / f"{i}.png").write_bytes(picture_bytes(i))
    (root / "broken.jsonl").write_text(json.dumps(BUNDLED_ROWS[0]) + "\n{not json\n")
    (root / "docs").mkdir()  # a key-value dataset: the reference is JSON, scored per field
    (root / "docs" / "0.png").write_bytes(picture_bytes(0))
    (root / "docs" / "metadata.jsonl").write_bytes(metadata([{"file_name": "0.png", "prompt": "Fields as JSON?",
                                                              "answer": json.dumps(DOC_FIELDS)}]))
    return root


@pytest.fixture(scope="module")
def app(data_dir):
    env = {"G4V_MAX_DATASET_BYTES": str(APP_MAX_BYTES), "G4V_MAX_DATASET_FILES": str(APP_MAX_FILES)}
    with running_app("--data-dir", str(data_dir), env=env) as url:
        yield url


@pytest.fixture(scope="module")
def client(app):
    return Client(app, verbose=False)


def evaluate(client, arm_a="app", arm_b="app+tiny-trained-french", dataset="bundled", files=None, columns=("",) * 5,
             limit=LIMIT, seed=None, max_new_tokens=16, blank_probe=False, levels=False, margin=0.02, discordance=0.1):
    sent = [handle_file(str(f)) for f in files] if files else None
    return client.predict(arm_a, arm_b, dataset, sent, *columns, limit, seed, max_new_tokens, blank_probe, levels,
                          margin, discordance, api_name="/evaluate")


def refusal(client, **kwargs) -> str:
    with pytest.raises(Exception) as refused:
        evaluate(client, **kwargs)
    return str(refused.value)


@pytest.fixture(scope="module")
def uploads_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("uploads")
    make_zip(folder / "slip.zip", {"../../evil.png": b"x"})
    make_zip(folder / "bomb.zip", {"data/metadata.jsonl": b"{}\n", "data/big.png": bytes(2 * APP_MAX_BYTES)})
    make_zip(folder / "many.zip", {f"data/{i}.png": b"x" for i in range(APP_MAX_FILES + 1)})
    make_zip(folder / "good.zip", small_dataset())
    return folder


#: Arms and datasets are dropdowns: Gradio itself refuses a value that is not offered, in one line.
NOT_OFFERED = "is not in the list of choices"
BAD_INPUT = [
    ("no arm", {"arm_a": ""}, NOT_OFFERED),
    ("arm not offered", {"arm_b": "openai:http://169.254.169.254/v1"}, NOT_OFFERED),
    ("dataset path typed", {"dataset": "/etc"}, NOT_OFFERED),
    ("upload chosen, nothing sent", {"dataset": "upload"}, "no dataset uploaded"),
    ("zip slip", {"dataset": "upload", "files": ["slip.zip"]}, "leaves its folder"),
    ("zip bomb", {"dataset": "upload", "files": ["bomb.zip"]}, "unpacks to 8 MiB, the limit is 4 MiB"),
    ("too many files", {"dataset": "upload", "files": ["many.zip"]}, f"{APP_MAX_FILES + 1} files"),
    ("unknown column", {"columns": ("", "question_text", "", "", "")}, "column 'question_text' (for prompt)"),
    ("broken JSON line", {"dataset": "data1:broken.jsonl"}, "line 2 of broken.jsonl is not valid JSON"),
    ("margin past 1", {"margin": 2}, "Equivalence margin must be a number of at least 0.001 and below 1"),
    ("margin of 1e-300", {"margin": 1e-300}, "Equivalence margin must be a number of at least 0.001 and below 1"),
    ("no discordance", {"discordance": 0}, "Assumed share of rows right in one arm only must be a number between 0 and 1"),
    ("negative limit", {"limit": -3}, "Rows must be 0 (all) or a whole number of at least 1, got -3"),
    ("fractional limit", {"limit": 2.5}, "Rows must be 0 (all) or a whole number of at least 1, got 2.5"),
    ("fractional seed", {"seed": 1.5}, "Shuffle seed must be -1 (dataset order) or a whole number of at least 0, got 1.5"),
    ("no new tokens", {"max_new_tokens": 0}, "must be from 1 to"),  # the slider's range, named
    ("adapter arm not offered", {"arm_b": "app+../../etc"}, NOT_OFFERED),
]


@pytest.mark.parametrize("kwargs, expected", [case[1:] for case in BAD_INPUT], ids=[case[0] for case in BAD_INPUT])
def test_bad_input_is_refused_in_one_line(client, uploads_dir, kwargs, expected):
    if "files" in kwargs:
        kwargs = {**kwargs, "files": [uploads_dir / name for name in kwargs["files"]]}
    message = refusal(client, **kwargs)
    assert expected in message
    assert "\n" not in message.strip() and "Traceback" not in message
    assert not re.search(r"/(tmp|work|home|root)/", message), message


def exported_rows(export_path: str) -> list[SampleResult]:
    with zipfile.ZipFile(export_path) as zipped:
        assert {"samples.parquet", "samples.csv", "summary.json"} <= set(zipped.namelist())
        table = pd.read_parquet(io.BytesIO(zipped.read("samples.parquet")))
        summary = json.loads(zipped.read("summary.json"))
    rows = [SampleResult(**{k: (None if pd.isna(v) else v) if not isinstance(v, (list, dict)) else v
                            for k, v in record.items()}) for record in table.to_dict("records")]
    return rows, summary


DOC_FIELDS = {"count": 1, "shapes": [{"shape": "star", "colour": "red"}]}


def test_the_api_scores_a_key_value_dataset_per_field(client):
    """A JSON reference gets the per-field table: each leaf path a row, both arms the same model
    (noise floor), so nothing moved; the random-weight model's answer is no JSON: all missing."""
    *_, equivalence, fields, drift, _, _, _, _, _, _, summary = evaluate(client, dataset="data1:docs", arm_b="same", limit=None,
                                                                  max_new_tokens=4)
    names = ["$.count", "$.shapes[*].colour", "$.shapes[*].shape"]
    assert fields["visible"] and [row[0] for row in fields["value"]["data"]] == names  # none moved: by name
    assert all(row[1:] == [1, "0 / 0 / 1 / 0", "0 / 0 / 1 / 0", 0, 0] for row in fields["value"]["data"])
    assert summary["fields"]["rows"] == 1 and summary["fields"]["moved"] == [] and not drift["visible"]


def test_the_api_runs_a_noise_floor(client):
    """Arm B "same": the app's engine answers the rows twice; greedy, so not one row differs."""
    status, aggregate, equivalence, fields, *_, summary = evaluate(client, arm_b="same", limit=4, margin=0.05)
    assert summary["noise_floor"] == {"rows": 4, "disagree": 0, "text_differs": 0, "discordant": 0, "rate": 0.0}
    assert summary["arms"]["b"]["label"] == summary["arms"]["a"]["label"] + " again"
    assert summary["equivalence"]["margin"] == 0.05 and "noise floor (A run twice): 0 of 4 rows disagree" in equivalence
    wider = evaluate(client, arm_b="same", limit=4, margin=0.5)[-1]  # the same rows, summed up with another margin
    assert wider["equivalence"]["margin"] == 0.5 and wider["noise_floor"] == summary["noise_floor"]
    assert wider["equivalence"]["p_value"] < summary["equivalence"]["p_value"]
def test_the_api_runs_a_bf16_arm_with_per_level_drift(client):
    """The tab's "hf, bfloat16" arm (an engine of its own beside the app's float32 one): every row
    records the per-level drift of bf16 against float32, and the summary's means are those rows'."""
    outputs = evaluate(client, arm_b="app:dtype=bfloat16", limit=2, max_new_tokens=4)
    table, export, summary = outputs[4], outputs[-2], outputs[-1]
    rows, saved = exported_rows(export)
    assert saved == summary and summary["arms"]["b"]["label"] == "hf bfloat16"
    drift = summary["level_drift"]
    assert drift["n"] == 2 and drift["of"] == "hf bfloat16" and len(drift["levels"]) == 8
    per_row = [json.loads(row.level_drift) for row in rows]
    for name, level in drift["levels"].items():
        assert level["rel_error_max"] == max(row["levels"][name]["rel_error"] for row in per_row) > 0
        assert level["cosine_min"] == min(row["levels"][name]["cosine"] for row in per_row) < 1
    shown = {cells[0]: cells for cells in table["value"]["data"]}  # the tab's drift table: the same numbers
    assert table["visible"] and list(shown) == list(drift["levels"])
    assert all(float(shown[name][2]) == pytest.approx(level["rel_error_max"], rel=5e-3)  # shown to 3 digits
               for name, level in drift["levels"].items())


def test_the_api_runs_base_against_the_adapter_and_resumes(client):
    """After all the refusals the app still runs: 8 rows of the bundled dataset, base vs the French
    adapter. The returned summary equals summarise() of the exported rows; accuracy and agreement
    recounted here by hand; a second identical call is answered from the kept run folder."""
    status, aggregate, equivalence, fields, drift, *pictures, samples, export, summary = evaluate(client)
    assert summary["n"] == LIMIT and summary["complete"] and summary["n_errors"] == 0
    rows, saved = exported_rows(export)
    assert saved == summary
    assert summarise(rows, summary["arms"]["a"]["label"], summary["arms"]["b"]["label"]).to_dict() == summary
    for row in rows:  # an independent recount of the normalised match
        assert row.correct_a == (row.answer_a.strip().lower().rstrip(".!?") == row.reference.lower())
    assert summary["arms"]["a"]["accuracy"] == sum(r.correct_a for r in rows) / LIMIT
    assert summary["agreement"] == sum(r.answer_a == r.answer_b for r in rows) / LIMIT
    colour = summary["by_category"]["colour"]  # the adapter answers colours in French, nothing else changes
    assert colour["agreement"] == 0.0
    assert all(summary["by_category"][kind]["agreement"] == 1.0 for kind in ("shape", "position", "count"))
    assert [r[0] for r in aggregate["data"]] == ["all", "colour", "count", "position", "shape"]
    assert len(samples["data"]) == LIMIT and samples["data"][0][2] == "colour"  # disagreements first
    assert all(Path(p).is_file() for p in pictures)
    assert "Finished" in status
    test = summary["equivalence"]  # the French adapter changes colour answers: not equivalent
    assert not test["equivalent"] and test["verdict"] in equivalence
    assert not fields["visible"] and NO_FIELDS in equivalence  # no structured reference: no table, one line
    assert not drift["visible"]  # an adapter pair, not a precision pair

    again = evaluate(client)
    assert again[-1] == summary  # the kept folder: nothing recomputed, nothing different


def test_a_data_folder_dataset_keeps_a_bad_row_and_an_upload_runs(client, uploads_dir):
    *_, samples, _, summary = evaluate(client, dataset="data1:tiny", arm_b="app", limit=None)
    assert summary["n"] == 3 and summary["n_errors"] == 1
    bad = [row for row in samples["data"] if row[-1]]
    assert len(bad) == 1 and bad[0][-1] == "image not found: 'images/missing.png'"
    *_, summary = evaluate(client, dataset="upload", files=[uploads_dir / "good.zip"], arm_b="app", limit=None)
    assert summary["n"] == 3 and summary["n_errors"] == 0 and summary["agreement"] == 1.0


# ── the browser ────────────────────────────────────────────────────────────────────────────────


def finished(page, word: str = "Finished") -> None:
    page.wait_for_function("(w) => (document.querySelector('#eval-status') || {}).innerText?.includes(w)",
                           arg=word, timeout=300_000)


#: What the status box shows while a run works, once it has rows done ("8/120 samples").
ROWS_DONE = r"[1-9]\d*/\d+ samples"


def rows_done_or_over(page, url: str, ends: str = "Finished|Stopped") -> str:
    """Wait until the run shows rows done and return the status box's text then; fail saying what
    the page and the app showed if the box says the run ``ends`` (a regular expression) first, an
    error toast comes, or no rows show for 5 minutes (a wait for the rows alone once ran out saying
    nothing)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        shown = page.wait_for_function(
            "([rows, ends]) => { const text = document.querySelector('#eval-status').innerText;"
            " if (new RegExp(rows).test(text)) return text;"
            " return (new RegExp(ends).test(text) || document.querySelector(\"[data-testid='toast-body'].error\"))"
            " && 'over'; }", arg=[ROWS_DONE, ends], timeout=300_000).json_value()
        if shown != "over":
            return shown
    except PlaywrightTimeout:
        pass
    status = page.inner_text("#eval-status")
    toasts = page.locator("[data-testid='toast-body']").all_inner_texts()
    log = TEST_OUTPUT / f"app-{url.rstrip('/').rsplit(':', 1)[-1]}.log"  # running_app's log, by port
    log_end = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log.is_file() else "(no log)"
    pytest.fail(f"the run showed no rows done: status {status!r}, toasts {toasts!r}, the app's log ends:\n{log_end}")


def run_in_browser(page, url: str, limit: int, stop_once: bool = False,
                   arm_b: str = "hf + adapter tiny-trained-french") -> None:
    """Open the Evaluate tab, pick base vs the French adapter (or the ``arm_b`` option) on the
    bundled dataset, run, and wait for the aggregate table (also the steps of docs/evaluate.md's screenshot).
    ``stop_once``: press Stop as soon as the run works, see the partial result, then Run again."""
    page.goto(url)
    page.get_by_role("tab", name="Evaluate").click()
    for box, option in (("#eval-arm-a", "hf (the app's model)"), ("#eval-arm-b", arm_b)):
        page.locator(f"{box} input").click()
        page.locator(f"{box} [role=option]", has_text=option).filter(visible=True).first.click()
        page.locator(f"{box} input").press("Escape")  # its list closes, so the next box's list is the only one
        assert option in page.locator(f"{box} input").input_value()  # the option chosen (its label may go on)
    page.locator("#eval-limit input").fill(str(limit))
    assert page.locator("#eval-limit input").input_value() == str(limit)
    page.locator("#eval-run").click()
    if stop_once:  # Stop once the first rows are done (rows are answered in chunks: the run is not over)
        rows_done_or_over(page, url)
        page.locator("#eval-stop").click()
        finished(page, "Stopped")
        done = int(re.search(r"Stopped.*?: (\d+) sample", page.inner_text("#eval-status")).group(1))
        assert done < limit  # the partial result is shown...
        page.locator("#eval-run").click()  # ...and the same settings resume it
        shown = rows_done_or_over(page, url, ends="Finished")  # the stopped run's line says "Stopped"...
        assert "Stopped" not in shown and PREVIOUS_RUN.strip("*") not in shown  # ...hidden under the bar
    finished(page)


#: Rows of the run the browser test stops and resumes: enough chunks that a Stop pressed after the
#: first lands before the last (batched answers, and each picture encoded once, made 12 rows finish
#: within a second or two).
STOPPED_RUN_ROWS = 120


def test_the_tab_in_a_browser_runs_and_opens_a_row_in_chat(app, output_dir):
    with browser_page(width=1400, height=1000) as page:
        run_in_browser(page, app, limit=STOPPED_RUN_ROWS, stop_once=True)
        assert f"{STOPPED_RUN_ROWS} sample(s)" in page.inner_text("#eval-status")
        page.screenshot(path=str(output_dir / "evaluate-tab.png"), full_page=True)
        groups = [page.locator(f"#eval-aggregate [data-testid=cell-{row}-0]").inner_text().strip() for row in range(5)]
        assert groups == ["all", "colour", "count", "position", "shape"]

        category, prompt_column = SAMPLE_HEADERS.index("category"), SAMPLE_HEADERS.index("prompt")
        assert page.locator(f"#eval-samples [data-testid=cell-0-{category}]").inner_text().strip() == "colour"  # worst first
        prompt_cell = page.locator(f"#eval-samples [data-testid=cell-0-{prompt_column}]")
        prompt = prompt_cell.inner_text().strip()
        prompt_cell.click()
        page.wait_for_function("() => document.querySelector('#eval-picked').innerText.includes('selected')")
        page.locator("#eval-open-chat").click()
        box = page.locator("#chat-box textarea")
        box.wait_for(state="visible")
        page.wait_for_function("(p) => document.querySelector('#chat-box textarea').value === p", arg=prompt)
        assert page.locator("#chat-box img").count() >= 1  # the sample's picture is attached
        page.screenshot(path=str(output_dir / "evaluate-open-in-chat.png"), full_page=True)

        for tab in ("deepstack", "lora"):  # the same row, opened in the other two tabs
            page.get_by_role("tab", name="Evaluate").click()
            page.locator(f"#eval-open-{tab}").click()
            page.wait_for_function("([tab, p]) => document.querySelector(`#${tab}-prompt textarea`)?.value === p",
                                   arg=[tab, prompt])
            page.locator(f"#{tab}-image img").first.wait_for(state="visible")
        assert "tiny-trained-french" in page.locator("#lora-adapter input").input_value()  # arm b's adapter


@pytest.mark.parametrize("row", ["abc", [1], True, -1, 2.5, "1_0", "\u0661", 10**12])
def test_a_row_value_that_is_not_a_row_number_is_one_line(tmp_path, row):
    """"Open in ..." takes the selected row's first cell as sent by the page (or a hand-made
    request): anything but a row number is one line, not "failed unexpectedly" (issue 31)."""
    from webapp.evaluate import STORES, EvalWorkspace
    from webapp.sessions import SessionStores

    workspace = EvalWorkspace(SessionStores(tmp_path, STORES))
    run = {"source": str(BUNDLED_DATASET), "columns": {}, "adapters": [None, None]}
    with workspace.sessions.using("visitor") as visitor:
        with pytest.raises(G4VError) as refused:
            workspace.sample_pictures(run, row, visitor)
        assert "\n" not in str(refused.value) and "row" in str(refused.value)
        paths, prompt = workspace.sample_pictures(run, "1", visitor)  # a real row number still opens
        assert prompt == BUNDLED_ROWS[1]["prompt"] and all(Path(p).is_file() for p in paths)
    workspace.sessions.close()


def test_a_zip_that_cannot_be_unpacked_says_why_in_words(tmp_path):
    """The refusal named a Python class ("cannot be unpacked (NotImplementedError)"); now it says
    what is wrong with the zip."""
    unknown = make_zip(tmp_path / "method.zip", {"data/metadata.jsonl": b"{}\n"})
    raw = bytearray(unknown.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # the method of the entry: 99 (AES)
        at = raw.index(signature) + offset
        raw[at:at + 2] = (99).to_bytes(2, "little")
    unknown.write_bytes(bytes(raw))
    clash = make_zip(tmp_path / "clash.zip", {"data/metadata.jsonl": b"{}\n", "data/a.png": b"x", "data/a.png/b.png": b"x"})
    for archive, words in ((unknown, "it uses a compression method that cannot be read here (stored, deflate, bzip2 and "
                                     "lzma can)"),
                           (clash, "two of its entries have one name (a file twice, or a file and a folder)")):
        into = tmp_path / archive.stem
        into.mkdir()
        with pytest.raises(G4VError) as refused:
            uploads.extract_upload([archive], into)
        assert str(refused.value) == f"{archive.name} cannot be unpacked: {words}"
        assert "Error" not in str(refused.value)
