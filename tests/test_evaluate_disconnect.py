"""A dataset run ends with its visitor, and never holds the other tabs (a served app, real clients).

The red team's sweep (kept 1..100, all four policies: 119,100 row-runs) went on after its client
closed the stream, and another visitor's ``/circuits_attention`` waited behind it for minutes. Here
a client starts that sweep through the page's own queue protocol, then closes its stream: meanwhile
another visitor's Circuits request is served, and a third visitor's ``/evaluate`` starts within 10 s
of the close (runs take turns in a group of their own, one at a time by default).
"""

import json
import time
import uuid

import httpx
import pytest

from g4v.paths import EXAMPLES_DIR

#: The bound of the issue: the next visitor's run starts this soon after a client went away.
SERVED_WITHIN = 10.0


class Visitor:
    """One browser session speaking Gradio's queue protocol (join, then read the event stream)."""

    def __init__(self, url: str):
        self.url, self.session = url, uuid.uuid4().hex
        config = httpx.get(url + "config", timeout=30).json()
        self.endpoints = {d.get("api_name"): d["id"] for d in config["dependencies"] if d.get("api_name")}

    def join(self, api_name: str, data: list) -> None:
        httpx.post(self.url + "gradio_api/queue/join", timeout=30, json={
            "data": data, "fn_index": self.endpoints[api_name], "session_hash": self.session,
            "event_data": None, "trigger_id": None}).raise_for_status()

    def stream(self):
        return httpx.stream("GET", self.url + "gradio_api/queue/data", params={"session_hash": self.session},
                            timeout=httpx.Timeout(30, read=None))

    def messages(self, events, deadline: float):
        """The stream's messages, until ``deadline`` (``time.monotonic``): then an AssertionError."""
        for line in events.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError("no answer in time")
            if line.startswith("data:"):
                yield json.loads(line.removeprefix("data:"))


def upload(url: str, path) -> dict:
    with open(path, "rb") as picture:
        [server_path] = httpx.post(url + "gradio_api/upload", files={"files": picture}, timeout=30).json()
    return {"path": server_path, "meta": {"_type": "gradio.FileData"}}


def completed(visitor: Visitor, seconds: float) -> dict:
    with visitor.stream() as events:
        for message in visitor.messages(events, time.monotonic() + seconds):
            if message.get("msg") == "process_completed":
                return message
    raise AssertionError("the stream ended without an answer")


def test_a_closed_stream_stops_the_run_and_no_run_holds_the_other_tabs(app_url):
    sweeper = Visitor(app_url)
    # arm A, the bundled dataset, no upload, guessed columns, every row, its order, 4 new tokens;
    # kept 1..100 and every policy: hours of work
    sweeper.join("evaluate_budget", ["app", "bundled", None, "", "", "", "", "", 0, -1, 4,
                                     ",".join(map(str, range(1, 101))), ["norm", "attention", "attribution", "random"]])
    with sweeper.stream() as events:
        for message in sweeper.messages(events, time.monotonic() + 240):
            units = [unit.get("unit") for unit in (message.get("progress_data") or [])]
            if message.get("msg") == "progress" and "rows" in units:
                break  # the sweep answers rows
            assert message.get("msg") != "process_completed", message

        # while it runs, another visitor's Circuits request is served (on main it queued behind the sweep)
        reader = Visitor(app_url)
        reader.join("circuits_attention", [upload(app_url, EXAMPLES_DIR / "shapes-tall.png"), "What colour is it?",
                                           "2-3", ""])
        done = completed(reader, 120)
        assert done["success"], done
    closed = time.monotonic()  # the sweep's client has gone: its stream is closed

    runner = Visitor(app_url)
    runner.join("evaluate", ["app", "app", "bundled", None, "", "", "", "", "", 2, -1, 4, False, False])
    with runner.stream() as events:
        for message in runner.messages(events, closed + 120):
            if message.get("msg") == "process_starts":
                started = time.monotonic()
                break
        else:
            pytest.fail("the run never started")
    assert started - closed < SERVED_WITHIN, f"the next run waited {started - closed:.1f} s"
