"""The Evaluate tab's "Open in ..." buttons: the selected sample's picture(s) and prompt put into
the Chat, Deepstack or LoRA tab (with the run's adapter, for LoRA), and that tab shown. Each
button's handler returns its values by box (:class:`~webapp.common.OutputBoxes`)."""

from dataclasses import dataclass

import gradio as gr

from webapp.common import OutputBoxes, shows_errors
from webapp.sessions import session_key


@dataclass
class OpenInChat(OutputBoxes):
    """What "Open in Chat" fills: the chat's message box, and the tabs (to show Chat)."""

    message: gr.MultimodalTextbox
    tabs: gr.Tabs


@dataclass
class OpenInDeepstack(OutputBoxes):
    """What "Open in Deepstack" fills."""

    image: gr.Image
    prompt: gr.Textbox
    tabs: gr.Tabs


@dataclass
class OpenInLora(OutputBoxes):
    """What "Open in LoRA" fills: the adapter too, when the run had one."""

    image: gr.Image
    prompt: gr.Textbox
    adapter: gr.Dropdown
    tabs: gr.Tabs


@dataclass
class OpenTargets:
    """The other tabs' inputs a sample can be opened in, per button."""

    chat: OpenInChat
    deepstack: OpenInDeepstack
    lora: OpenInLora


def open_handlers(workspace, targets: OpenTargets):
    """The three buttons' handlers (Chat, Deepstack, LoRA): each takes the run and the selected row
    and returns its values by box."""

    def pictures(run, index, request):
        with workspace.sessions.using(session_key(request)) as visitor:
            return workspace.sample_pictures(run, index, visitor)

    @shows_errors
    def open_chat(run, index, request: gr.Request = None):
        paths, prompt = pictures(run, index, request)
        return {targets.chat.message: {"text": prompt, "files": paths}, targets.chat.tabs: gr.Tabs(selected="chat")}

    @shows_errors
    def open_deepstack(run, index, request: gr.Request = None):
        paths, prompt = pictures(run, index, request)
        shown = targets.deepstack
        return {shown.image: paths[0], shown.prompt: prompt, shown.tabs: gr.Tabs(selected="deepstack")}

    @shows_errors
    def open_lora(run, index, request: gr.Request = None):
        paths, prompt = pictures(run, index, request)
        shown, adapter = targets.lora, next((name for name in run["adapters"] if name), None)
        # gr.update, not gr.Dropdown(value=...): a new Dropdown without choices warns in the server
        # log that its value is not among them. No adapter: the box keeps its choice.
        chosen = {shown.adapter: gr.update(value=adapter)} if adapter else {}
        return {shown.image: paths[0], shown.prompt: prompt, **chosen, shown.tabs: gr.Tabs(selected="lora")}

    return open_chat, open_deepstack, open_lora


def wire_open_buttons(workspace, targets: OpenTargets, run_state, row_state, buttons) -> None:
    """Each of ``buttons`` (Chat, Deepstack, LoRA) puts the selected sample's picture(s) and prompt
    into that tab and switches to it."""
    views = (targets.chat, targets.deepstack, targets.lora)
    for button, handler, view in zip(buttons, open_handlers(workspace, targets), views, strict=True):
        button.click(handler, [run_state, row_state], view.components(), api_visibility="private")
