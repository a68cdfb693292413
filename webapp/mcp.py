"""The page's API as an MCP server for agents (``python app.py --mcp``; docs/mcp.md).

Gradio serves it (``launch(mcp_server=True)``, at ``/gradio_api/mcp/``): every public API endpoint
(an event with an ``api_name``) is a tool, its JSON input schema read from the endpoint's
components and its description from the handler's docstring (the lines before ``Args:``, one line
per parameter under ``Args:``, the items under ``Returns:``). A tool call goes through the same
endpoint as an API call (Gradio's server calls it with ``gradio_client``), so it gets the same
checks, limits, queue and one-line refusals; a picture is a URL (fetched by Gradio as for an API
call) or a ``data:`` URL (an upload).

What :class:`WorkbenchMCPServer` changes in Gradio 6.31's server, each checked by tests/test_mcp.py:

* tools are named after their endpoints (``chat``, ``tiling``, ``inspect``), not after the Python
  functions behind them, so an agent reads the API's names;
* an endpoint with several outputs answered with one text (the tuple ``gradio_client`` returns,
  printed) unless the agent asked for progress, and one with ``gr.State`` outputs (Tiling keeps
  five) failed with "pop index out of range": here every output is its own content, pictures as
  pictures, with or without progress;
* a refusal reads as the API's, in one line: with progress Gradio put "Error: " before it;
* a picture named by a server path is refused with the API's line, not Gradio's echo of the path;
* pictures inside an argument (the Chat message's ``files``) are taken as URLs too: Gradio wrote a
  schema whose ``$ref`` pointed nowhere (every client refused it) and never converted list items.

Every tool call comes through one ``gradio_client`` session of Gradio's: what a session keeps is
shared by all agents, so the Chat tool answers each call as a conversation of its own
(:func:`from_mcp`), and an export link is pruned like one busy visitor's."""

from urllib.parse import urljoin

import gradio as gr
from gradio.components import State
from gradio.mcp import GradioMCPServer

from g4v.errors import G4VError
from webapp.intake import NOT_UPLOADED

#: Where Gradio serves the MCP server (its streamable HTTP transport), below the app's address.
MCP_PATH = "gradio_api/mcp/"
#: The header Gradio's MCP server sends with each tool call it makes through its own client.
MCP_USER = ("x-gradio-user", "mcp")


def use_workbench_mcp_server() -> None:
    """Make Gradio serve :class:`WorkbenchMCPServer` (before ``launch(mcp_server=True)``); raise
    :class:`G4VError` in one line when the ``mcp`` package it needs is missing (Gradio itself would
    only log that and serve the page without the tools)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise G4VError("--mcp needs the mcp package: pip install -r requirements.txt") from None
    import gradio.mcp

    gradio.mcp.GradioMCPServer = WorkbenchMCPServer  # the one name gradio.routes builds its server from


def mcp_url(local_url: str) -> str:
    """The MCP server's address for an app served at ``local_url``."""
    return urljoin(local_url, MCP_PATH)


def from_mcp(request: gr.Request | None) -> bool:
    """Whether a request is a tool call of the MCP server (through its one shared session)."""
    headers = getattr(request, "headers", None) or {}
    return headers.get(MCP_USER[0]) == MCP_USER[1]


class WorkbenchMCPServer(GradioMCPServer):
    """Gradio's MCP server with the API's tool names, every output as its own content, and the
    API's refusals (see the module's docstring)."""

    def get_tool_to_endpoint(self) -> dict[str, str]:
        tools: dict[str, str] = {}
        for endpoint in self.api_info["named_endpoints"]:
            tools[self.valid_and_unique_tool_name(self.tool_prefix + endpoint.lstrip("/"), set(tools))] = endpoint
        return tools

    def warn_about_state_inputs(self) -> None:
        """Gradio warns that a ``gr.State`` input keeps its first value between tool calls; here the
        session's values are kept (see the module's docstring), so the warning would mislead."""

    def get_input_schema(self, tool_name, parameters=None):
        schema, positions = super().get_input_schema(tool_name, parameters)
        return _without_refs(schema), positions

    def convert_strings_to_filedata(self, value, filedata_positions):
        # Gradio names a list's items "items" in a position; each item of the value is one.
        def expanded(position, node) -> list:
            if not position:
                return [[]]
            head, rest = position[0], position[1:]
            if head == "items" and isinstance(node, list):
                return [[index, *tail] for index, item in enumerate(node) for tail in expanded(rest, item)]
            if not isinstance(node, dict) or head not in node:  # not sent (or Gradio's own "$defs")
                return []
            return [[head, *tail] for tail in expanded(rest, node[head])]

        positions = [path for position in filedata_positions for path in expanded(position, value)]
        try:
            return super().convert_strings_to_filedata(value, positions)
        except ValueError as err:  # a server path: the API's line (Gradio's would echo the path back)
            if str(err).startswith("Invalid file data format"):
                raise ValueError(NOT_UPLOADED) from None
            raise

    async def _execute_tool_without_progress(self, job) -> list:
        # gradio_client's result: the value for one output, a tuple for several (not one item).
        [result] = await super()._execute_tool_without_progress(job)
        return list(result) if isinstance(result, tuple) else [result]

    async def _execute_tool_with_progress(self, job, progress_token) -> list:
        try:
            return await super()._execute_tool_with_progress(job, progress_token)
        except RuntimeError as err:  # "{title}: {message}", the title being gr.Error's default
            raise RuntimeError(str(err).removeprefix("Error: ")) from None

    @staticmethod
    def pop_returned_state(components, data) -> list:
        # Gradio popped by index while popping, so a second State output was looked for past the end.
        return [value for component, value in zip(components, data, strict=True) if not isinstance(component, State)]


def _without_refs(schema: dict) -> dict:
    """A tool's input schema whose references resolve: Gradio rewrote each picture as a URL string
    in place but left its ``$ref`` to a ``$defs`` that sits in the argument, not at the schema's
    root. The pictures' references go; any other ``$defs`` move to the root, where ``#/$defs/``
    points."""
    defs: dict = {}

    def walk(node):
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$defs" in node:
            defs.update(walk(node["$defs"]))
        file_url = str(node.get("format", "")).startswith("Gradio File Input")
        return {key: walk(value) for key, value in node.items() if key != "$defs" and not (file_url and key == "$ref")}

    schema = walk(schema)
    return {**schema, "$defs": defs} if defs and "$ref" in repr(schema) else schema
