"""Visitors' files apart (issue 31, H8 and M1): every export, upload and opened sample lies in a
folder of its own visitor's, under names nobody can guess from their own; an export holds no server
path; one visitor's work never deletes another's files; a closed session's files go; nothing is
left once the app stops; and exports are served without a second copy in Gradio's cache.

One app for the module (two gradio_client sessions against it); the store rules themselves are
checked in process, without the app."""

import io
import json
import re
import time
import zipfile
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from gradio_client import Client, handle_file

from g4v.errors import G4VError
from g4v.model.exports import ExportStore
from g4v.paths import BUNDLED_MODEL_DIR, EXAMPLES_DIR, REPO_ROOT
from tests.conftest import running_app
from tests.test_evaluate_app import make_zip, small_dataset
from webapp.sessions import SessionStores

KEEP = 8  # the app's Deepstack exports kept per visitor (webapp.layout: max(8, 2 x concurrency))


# ── the stores, in process ─────────────────────────────────────────────────────────────────────


def test_folder_names_are_random_not_sequential(tmp_path):
    store = ExportStore(tmp_path, keep=100)
    names = [store.new_folder().name for _ in range(40)]
    assert len(set(names)) == 40
    tokens = [name.removeprefix("inspect-") for name in names]
    assert all(len(token) >= 22 for token in tokens)  # 16 random bytes, base64: 128 bits
    assert not any(re.fullmatch(r"\d+", token) for token in tokens)
    assert re.fullmatch(r"g4v-inspect-[\w-]{22,}", store.root.name)
    store.close()


def test_a_leased_folder_outlives_the_bound_and_goes_after(tmp_path):
    store = ExportStore(tmp_path, keep=1)
    dataset = store.new_folder()
    with store.lease(dataset / "metadata.jsonl") as leased:
        assert leased == dataset
        newer = [store.new_folder() for _ in range(3)]
        assert dataset.is_dir() and newer[-1].is_dir()  # leased, and the newest is never pruned
        assert not any(folder.exists() for folder in newer[:-1])
    assert not dataset.exists() and newer[-1].is_dir()  # released: the bound holds again
    with store.lease(tmp_path / "elsewhere") as leased:
        assert leased is None
    store.close()


def test_sessions_are_apart_and_bounded_and_a_busy_one_stays(tmp_path):
    sessions = SessionStores(tmp_path, {"inspect": 2}, max_sessions=2)
    with sessions.using("one") as one:
        mine = one.stores["inspect"].new_folder()
        with sessions.using("two") as two:
            theirs = two.stores["inspect"].new_folder()
            assert one.root != two.root and one.root not in theirs.parents
        for key in ("three", "four"):  # beyond the bound: the idle "two" goes, the busy "one" stays
            with sessions.using(key):
                pass
        assert mine.is_dir() and not theirs.exists()
        sessions.end("one")  # its page was closed while its request still runs
        assert mine.is_dir()
    assert not mine.exists() and not one.root.exists()
    sessions.close()
    assert list(tmp_path.iterdir()) == []


def test_the_byte_bound_removes_the_least_recent_sessions(tmp_path, monkeypatch):
    import webapp.sessions

    monkeypatch.setattr(webapp.sessions, "MEASURE_SECONDS", 0.0)
    sessions = SessionStores(tmp_path, {"files": 4}, max_bytes=2500)
    roots = []
    for key in ("a", "b", "c"):
        with sessions.using(key) as visitor:
            (visitor.stores["files"].new_folder() / "blob").write_bytes(bytes(1000))
            roots.append(visitor.root)
    with sessions.using("d"):  # 3000 bytes kept: "a", the least recent, goes
        pass
    assert [root.exists() for root in roots] == [False, True, True]
    sessions.close()


def test_another_visitors_uploads_do_not_evict_a_running_evaluations_dataset(tmp_path):
    """M1 as reported: four other visitors choosing datasets deleted a running evaluation's dataset."""
    from webapp.evaluate import KEEP_UPLOADS, STORES, EvalWorkspace

    workspace = EvalWorkspace(SessionStores(tmp_path, STORES))
    archive = make_zip(tmp_path / "good.zip", small_dataset())
    with workspace.sessions.using("runner") as runner:
        source = workspace.extract([str(archive)], runner)
        with runner.stores["uploads"].lease(source):  # as the running evaluation holds it
            for number in range(KEEP_UPLOADS + 1):
                with workspace.sessions.using(f"visitor{number}") as other:
                    other_zip = make_zip(tmp_path / f"other{number}.zip", small_dataset(f"set{number}"))
                    workspace.extract([str(other_zip)], other)
            for number in range(KEEP_UPLOADS + 1):  # nor do its own later uploads
                own = make_zip(tmp_path / f"own{number}.zip", small_dataset(f"own{number}"))
                workspace.extract([str(own)], runner)
            assert (source / "metadata.jsonl").is_file()
        assert runner.root in source.parents
        with pytest.raises(G4VError, match="outside the data folders"):  # nor may one open another's
            from g4v.evaluate import open_dataset
            with workspace.sessions.using("visitor0") as other:
                open_dataset(str(source), None, workspace.allowed_dirs(other))
    workspace.sessions.close()


# ── two visitors against one app ───────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The app on the bundled checkpoint, its temporary files and Gradio's cache in a folder of the
    test's, so the checks can look at everything it wrote; ``stop()`` ends it early."""
    tmp = tmp_path_factory.mktemp("app")
    env = {"TMPDIR": str(tmp), "GRADIO_TEMP_DIR": str(tmp / "gradio")}
    with ExitStack() as stack:
        url = stack.enter_context(running_app("--model", str(BUNDLED_MODEL_DIR), env=env))
        yield SimpleNamespace(url=url, tmp=tmp, cache=tmp / "gradio", stop=stack.close)


def visitor(app) -> Client:
    return Client(app.url, verbose=False, download_files=False)  # file outputs as the server gives them


def inspect(client: Client) -> dict:
    *_, export = client.predict(handle_file(str(EXAMPLES_DIR / "shapes-wide.png")), "What colour is it?", [],
                                "deepstack0=0.5", False, api_name="/inspect")
    return export


def evaluate(client: Client, archive: Path) -> dict:
    outputs = client.predict("app", "app", "upload", [handle_file(str(archive))], *[""] * 5, 2, -1, 4, False, False,
                             api_name="/evaluate")
    return outputs[-2]


def fetch(app, url: str) -> httpx.Response:
    return httpx.get(app.url.rstrip("/") + url if url.startswith("/") else url, timeout=30)


def served_path(app, export: dict) -> Path:
    """The file behind an output, as a path below Gradio's cache (its URL names it)."""
    path = Path(export["path"])
    assert app.cache.resolve() in path.resolve().parents, path
    return path.resolve().relative_to(app.cache.resolve())


def neighbours(url: str) -> list[str]:
    """What a visitor would try from their own file address: each number in its path one off."""
    guesses = []
    for match in re.compile(r"\d+").finditer(url, url.index("file=")):
        for number in {int(match.group()) + step for step in (-1, 1, 2)} - {-1}:
            guesses.append(url[:match.start()] + str(number).zfill(len(match.group())) + url[match.end():])
    return guesses


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zipped:
        return {name: zipped.read(name) for name in zipped.namelist()}


def test_two_visitors_cannot_reach_each_others_files(app, tmp_path):
    archive = make_zip(tmp_path / "good.zip", small_dataset())
    first, second = visitor(app), visitor(app)
    exports = {"first": [inspect(first), evaluate(first, archive)],
               "second": [inspect(second), evaluate(second, archive)]}
    for export in exports["first"] + exports["second"]:
        assert fetch(app, export["url"]).status_code == 200
    mine = [served_path(app, e).parts for e in exports["first"]]
    theirs = [served_path(app, e).parts for e in exports["second"]]
    assert {parts[0] for parts in mine}.isdisjoint(parts[0] for parts in theirs)  # no folder in common
    for parts in mine + theirs:
        assert all(len(part) >= 22 for part in parts[:-1]), parts  # every folder name random
    for export in exports["second"]:  # guessing from one's own addresses finds nothing
        for guess in neighbours(export["url"]):
            assert fetch(app, guess).status_code in (403, 404), guess

    first.close()  # the page is closed: its files go (unload comes with the next heartbeat)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and any(fetch(app, e["url"]).status_code == 200 for e in exports["first"]):
        time.sleep(2)
    assert all(fetch(app, e["url"]).status_code in (403, 404) for e in exports["first"])
    assert all(fetch(app, e["url"]).status_code == 200 for e in exports["second"])
    second.close()


def test_exports_hold_no_server_path(app, tmp_path):
    archive = make_zip(tmp_path / "good.zip", small_dataset())
    client = visitor(app)
    forbidden = [str(REPO_ROOT), str(app.tmp), "/tmp/", str(Path.home()), str(BUNDLED_MODEL_DIR)]
    for export in (inspect(client), evaluate(client, archive)):
        files = members(fetch(app, export["url"]).content)
        for name, data in files.items():
            found = [word for word in forbidden if word.encode() in data]
            assert not found, (name, found)
        if "run.json" in files:
            settings = json.loads(files["run.json"])
            assert settings["data"] == "upload: good.zip"
            assert settings["a"]["model"] == settings["b"]["model"] == BUNDLED_MODEL_DIR.name
        else:
            assert json.loads(files["summary.json"])["model"] == BUNDLED_MODEL_DIR.name
    client.close()


def test_another_visitors_work_does_not_evict_ones_export(app):
    """M1: more exports by someone else than a visitor's store keeps leave that visitor's export."""
    first, second = visitor(app), visitor(app)
    kept = inspect(first)
    for _ in range(KEEP + 1):
        inspect(second)
    assert fetch(app, kept["url"]).status_code == 200
    first.close()
    second.close()


def test_exports_are_not_copied_and_are_gone_after_shutdown(app):
    client = visitor(app)
    for _ in range(2):
        export = inspect(client)
        assert Path(export["path"]).name.startswith("inspect-") and export["path"].endswith(".zip")
    zips = sorted(app.tmp.rglob("inspect-*.zip"))
    assert zips and all(z.parent.parent.name.startswith("g4v-inspect-") for z in zips)  # no copies elsewhere
    client.close()
    app.stop()
    assert sorted(app.tmp.rglob("*.zip")) == [] and sorted(app.tmp.rglob("capture.safetensors")) == []
    assert not [p for p in app.tmp.rglob("g4v-*")]
    assert list(app.tmp.iterdir())  # the check looked where the app wrote


def test_the_launch_lines_offer_no_share_link(app):
    """Gradio's own launch lines suggest ``share=True``; this app prints its address and says it
    never makes a share link (issue 31)."""
    log_file = REPO_ROOT / "test-output" / f"app-{app.url.rstrip('/').rsplit(':', 1)[1]}.log"
    line = f"Running on local URL: {app.url.rstrip('/')}"
    log = log_file.read_text()  # running_app has waited for the line (and for the model)
    assert line in log
    assert "share=True" not in log and "public link" not in log
