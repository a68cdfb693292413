"""The API as an MCP server (``python app.py --mcp``), driven by the ``mcp`` package's own client
over streamable HTTP: the tools are the API's endpoints with typed inputs, a tool call answers what
the same API call answers (greedy Chat, Tiling, Deepstack: values, pictures by pixel), and bad
input gets the API's one-line refusal. Off unless asked for."""

import ast
import asyncio
import base64
import io
import json

import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from g4v.paths import BUNDLED_MODEL_DIR, EXAMPLES_DIR
from tests.conftest import running_app
from tests.test_app_bad_input import assert_one_clean_line, raw_call
from webapp.intake import NOT_UPLOADED
from webapp.mcp import mcp_url

PICTURE = EXAMPLES_DIR / "shapes-square.png"
NOT_A_PICTURE = b"this is not a picture"


def data_url(content: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(content).decode()


@pytest.fixture(scope="module")
def mcp_app():
    with running_app("--model", str(BUNDLED_MODEL_DIR), "--mcp") as url:
        yield url


@pytest.fixture(scope="module")
def api(mcp_app):
    return Client(mcp_app, verbose=False)


def mcp(url: str, calls):
    """Run ``calls(session)`` in one MCP client session on the app at ``url``; its result."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def run():
        async with streamablehttp_client(mcp_url(url)) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await calls(session)

    return asyncio.run(run())


def call(url: str, tool: str, arguments: dict, progress: bool = False):
    """One tool call; ``progress`` asks for progress notifications (Gradio answers by another path)."""
    async def ignore(*_):
        pass

    return mcp(url, lambda session: session.call_tool(tool, arguments, progress_callback=ignore if progress else None))


def pixels(picture) -> np.ndarray:
    """A picture's pixels: from an MCP image content, or from a file the API returned."""
    if hasattr(picture, "data"):
        picture = io.BytesIO(base64.b64decode(picture.data))
    return np.asarray(Image.open(picture).convert("RGB"))


def contents(result) -> list:
    """A tool's outputs in order: each picture's image content (Gradio follows it with its URL)."""
    assert not result.isError, result.content
    return [item for item in result.content if not (item.type == "text" and item.text.startswith("Image URL: "))]


def test_the_tools_are_the_api_endpoints_with_typed_inputs(mcp_app, api):
    tools = {tool.name: tool for tool in mcp(mcp_app, lambda session: session.list_tools()).tools}
    endpoints = {name.lstrip("/") for name in api.view_api(print_info=False, return_format="dict")["named_endpoints"]}
    assert set(tools) == endpoints and {"chat", "tiling", "tiling_token", "inspect"} <= endpoints
    chat = tools["chat"].inputSchema["properties"]
    assert chat["message"]["properties"]["files"]["items"]["type"] == "string"
    assert [chat[name]["type"] for name in ("max_new_tokens", "temperature", "top_p", "seed")] == ["number"] * 4
    assert tools["tiling"].inputSchema["properties"]["image_path"]["type"] == "string"
    inspect = tools["inspect"].inputSchema["properties"]
    assert inspect["ablate"]["type"] == "array" and "deepstack0" in inspect["ablate"]["items"]["enum"]
    assert inspect["full"]["type"] == "boolean"
    assert "$ref" not in repr(tools["chat"].inputSchema)  # Gradio's pointed at no definition
    for name in ("chat", "tiling", "tiling_token", "inspect"):  # what each returns, each argument explained
        assert "Returns: " in tools[name].description, name
        assert all(field["description"] for field in tools[name].inputSchema["properties"].values()), name


@pytest.mark.parametrize("progress", [False, True], ids=["plain", "with progress"])
def test_chat_answers_as_the_api_each_call_a_conversation_of_its_own(mcp_app, progress):
    """The MCP server makes every call through one session of its own, whose /chat history the
    second call would continue (seen by logging the history's length) but for ``from_mcp``. The
    bundled checkpoint's answer here happens not to change with an earlier turn, so the answer
    compared is the API's; how the call is told apart is the next test's."""
    arguments = {"message": {"text": "What colour is the shape?", "files": [data_url(PICTURE.read_bytes())]},
                 "max_new_tokens": 12, "temperature": 0.0, "top_p": 1.0, "seed": 0}
    through_api = Client(mcp_app, verbose=False).predict(
        {"text": "What colour is the shape?", "files": [handle_file(str(PICTURE))]}, 12, 0.0, 1.0, 0, api_name="/chat")
    earlier = {**arguments, "message": {"text": "Tell me a long story about red squares.", "files": []}}
    contents(call(mcp_app, "chat", earlier, progress))  # another agent's question: not a first turn of this one
    [answer] = contents(call(mcp_app, "chat", arguments, progress))
    assert answer.text == through_api


def test_chat_tells_the_mcp_servers_calls_by_the_header_it_sends():
    """What lets the Chat tool drop the shared session's history: Gradio's MCP server sends its
    calls with this header (read from its source), and an agent cannot send it (Gradio drops the
    agent's own); an API call without it keeps its conversation."""
    import inspect as source

    import gradio as gr
    from gradio.mcp import GradioMCPServer

    from webapp.mcp import MCP_USER, from_mcp

    assert f'headers={{"{MCP_USER[0]}": "{MCP_USER[1]}"}}' in source.getsource(GradioMCPServer._get_or_create_client)
    assert 'request_headers.pop("x-gradio-user", None)' in source.getsource(GradioMCPServer._prepare_tool_call_args)
    assert from_mcp(gr.Request(headers=dict([MCP_USER])))
    assert not from_mcp(gr.Request(headers={})) and not from_mcp(None)


@pytest.mark.parametrize("progress", [False, True], ids=["plain", "with progress"])
def test_tiling_answers_as_the_api(mcp_app, api, progress):
    overlay, table, index, token_view, token_info = api.predict(handle_file(str(PICTURE)), api_name="/tiling")
    got = contents(call(mcp_app, "tiling", {"image_path": data_url(PICTURE.read_bytes())}, progress))
    assert [item.type for item in got] == ["image", "text", "text", "image", "text"]
    assert np.array_equal(pixels(got[0]), pixels(overlay)) and np.array_equal(pixels(got[3]), pixels(token_view))
    assert ast.literal_eval(got[1].text) == table
    assert float(got[2].text) == index and got[4].text == token_info


def test_deepstack_answers_as_the_api(mcp_app, api):
    prompt = "What colour is the shape?"
    *figures, report, export = api.predict(handle_file(str(PICTURE)), prompt, ["deepstack1"], "", False,
                                           api_name="/inspect")
    table, figures = figures[0], figures[1:]
    got = contents(call(mcp_app, "inspect", {"image_path": data_url(PICTURE.read_bytes()), "prompt": prompt,
                                             "ablate": ["deepstack1"], "scales_text": "", "full": False}))
    assert [item.type for item in got] == ["text", "image", "image", "image", "image", "text", "text"]
    assert ast.literal_eval(got[0].text) == table
    for mine, theirs in zip(got[1:5], figures, strict=True):
        assert np.array_equal(pixels(mine), pixels(theirs))
    assert got[5].text == report
    assert got[6].text.startswith(mcp_app) and got[6].text.endswith(".zip")  # the export, by its link


def api_refusal(predict) -> str:
    with pytest.raises(Exception) as err:
        predict()
    return str(err.value)


def mcp_refusal(url: str, tool: str, arguments: dict, progress: bool = False) -> str:
    result = call(url, tool, arguments, progress)
    assert result.isError, result.content
    [line] = result.content
    return line.text


@pytest.mark.parametrize("progress", [False, True], ids=["plain", "with progress"])
def test_bad_input_gets_the_api_refusal(mcp_app, api, tmp_path, progress):
    message = {"text": "Hi", "files": []}
    said = mcp_refusal(mcp_app, "chat", {"message": message, "max_new_tokens": 8.5, "temperature": 0.0,
                                         "top_p": 1.0, "seed": 0}, progress)
    assert said == api_refusal(lambda: api.predict(message, 8.5, 0.0, 1.0, 0, api_name="/chat"))
    assert_one_clean_line(said, "max_new_tokens must be a whole number")

    # An upload that is no picture: Gradio names a data: URL's file "file.png".
    (tmp_path / "file.png").write_bytes(NOT_A_PICTURE)
    said = mcp_refusal(mcp_app, "tiling", {"image_path": data_url(NOT_A_PICTURE)}, progress)
    assert said == api_refusal(lambda: api.predict(handle_file(str(tmp_path / "file.png")), api_name="/tiling"))
    assert_one_clean_line(said, "file.png is not an image")


def test_pictures_by_address_are_fetched_as_for_the_api(mcp_app, api):
    """A URL is fetched by Gradio for both, which refuses private addresses (this machine's own
    included); a server path is the API's refusal, not an echo of the path."""
    address = f"{mcp_app}gradio_api/file={PICTURE}"
    said = mcp_refusal(mcp_app, "tiling", {"image_path": address})
    assert said == api_refusal(lambda: api.predict(handle_file(address), api_name="/tiling"))
    assert "failed validation" in said
    said = mcp_refusal(mcp_app, "tiling", {"image_path": "/etc/passwd"})
    assert said == NOT_UPLOADED
    # The API, sent the same path by hand (gradio_client would upload the client's own file).
    path = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
    events = raw_call(mcp_app, "tiling", json.dumps({"data": [path]}))
    assert "event: error" in events and json.dumps(NOT_UPLOADED) in events, events


def test_the_mcp_server_is_off_by_default(app_url):
    assert httpx.get(f"{app_url}gradio_api/mcp/", timeout=10).status_code == 404
    assert httpx.post(f"{app_url}gradio_api/mcp/", json={}, timeout=10).status_code in (404, 405)


SWITCHES = [  # (environment, flags, whether the MCP server is on)
    ({}, [], False), ({"G4V_MCP": "1"}, [], True), ({"G4V_MCP": "true"}, ["--no-mcp"], False), ({}, ["--mcp"], True),
    ({"GRADIO_MCP_SERVER": "True"}, [], True), ({"G4V_MCP": "0", "GRADIO_MCP_SERVER": "true"}, [], False),
    ({"G4V_MCP": "maybe"}, [], "app.py: error: G4V_MCP must be 1 or 0 (true or false), not 'maybe'")]
READ_SWITCHES = """
import contextlib, io, json, os, sys
import app
cases, sys.argv = json.loads(sys.argv[1]), ["app.py"]
for environment, flags, _ in cases:
    os.environ.update(environment)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            print(json.dumps(app.parse_args(flags).mcp))
    except SystemExit:
        print(json.dumps(err.getvalue().strip().splitlines()[-1]))
    for name in environment:
        del os.environ[name]
"""


def test_the_flag_and_the_environment_turn_it_on():
    """``app.parse_args`` in a process of its own (importing app.py sets Gradio's cache folder)."""
    import os
    import subprocess
    import sys

    from g4v.paths import REPO_ROOT

    environment = {name: value for name, value in os.environ.items() if name not in ("G4V_MCP", "GRADIO_MCP_SERVER")}
    read = subprocess.run([sys.executable, "-c", READ_SWITCHES, json.dumps(SWITCHES)], cwd=REPO_ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert [json.loads(line) for line in read.stdout.splitlines()] == [on for *_, on in SWITCHES], read.stderr


def test_a_call_over_the_transport_limit_is_refused_before_any_tool_runs(mcp_app):
    """The mcp package's streamable HTTP server refuses a request body over 4 MiB (a picture sent
    as a ``data:`` URL counts): the bound on an upload through MCP, below the API's 25 MB."""
    from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE

    response = httpx.post(mcp_url(mcp_app), content=b" " * (DEFAULT_MAX_REQUEST_BODY_SIZE + 1), timeout=30,
                          headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    assert response.status_code == 413
