"""The remote backend: an OpenAI-compatible chat-completions server, such as vLLM's.

This is how the workbench scales past one machine: a vLLM server (``vllm serve`` or
``python -m vllm.entrypoints.openai.api_server``) runs the model with its own tensor and pipeline
parallelism, and this engine only sends conversations over HTTP. Images travel inside the request
as ``data:image/png;base64`` URLs (PNG is lossless, so the server sees the same pixels), answers
come back as server-sent events, and LoRA adapters are chosen by the model name the server serves
them under (``--lora-modules NAME=PATH`` on the server).

Token ids: vLLM's ``return_token_ids`` extension sends the generated ids with every chunk, which
is what the parity tests compare. Servers without it still work; ``token_ids`` is then empty.

Every failure the user can do something about (server down, slow, refusing the request) becomes a
one-line :class:`~g4v.errors.G4VError`.
"""

import base64
import io
import json
import os
import threading
from collections.abc import Iterator

import httpx

from g4v.conversation import Message, SamplingSettings, validate_conversation
from g4v.engines.base import Engine, EngineInfo, Piece, messages_of, without_end_token
from g4v.errors import G4VError

#: Seconds to wait for the connection, and between two pieces of an answer (a long prefill on a
#: busy server can take a while before the first token).
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0


def image_data_url(image) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URL."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def chat_messages(messages: list[Message]) -> list[dict]:
    """OpenAI chat messages: images first, then the text, in each message's content list (the
    order the transformers engine renders them in)."""
    converted = []
    for message in messages:
        content = [{"type": "image_url", "image_url": {"url": image_data_url(image)}} for image in message.images]
        if message.text:
            content.append({"type": "text", "text": message.text})
        converted.append({"role": message.role, "content": content})
    return converted


def sampling_body(settings: SamplingSettings) -> dict:
    """The request fields for ``settings``: greedy is temperature 0; sampling sends top-p, the
    seed, and top-k off (vLLM's extension), as the transformers engine samples; a shortest answer
    is vLLM's ``min_tokens``."""
    body = {"max_tokens": settings.max_new_tokens, "temperature": float(settings.temperature)}
    if settings.min_new_tokens:
        body["min_tokens"] = settings.min_new_tokens  # vLLM's extension
    if not settings.greedy:
        body.update(top_p=settings.top_p, top_k=0)
        if settings.seed is not None:
            body["seed"] = settings.seed
    return body


class RemoteEngine(Engine):
    """Granite 4 Vision behind an OpenAI-compatible server at ``base_url``."""

    #: Connections a batch uses at once (the server batches what arrives).
    in_flight = 8

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 read_timeout: float = READ_TIMEOUT_S):
        if not base_url:
            raise G4VError("the openai backend needs the server's address: --base-url http://HOST:PORT/v1")
        self.base_url = normalise_base_url(base_url)
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, follow_redirects=False,
            timeout=httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT_S),
        )
        served = self._served_models()
        if model is not None and model not in served:
            raise G4VError(f"the server at {self.base_url} does not serve {model!r} (it serves {', '.join(served)})")
        self.model = model or next(iter(served))
        self._served = served
        self.info = EngineInfo(backend="openai", model=self.model, device=self.base_url,
                               details={"served_models": list(served)})

    # ── what the server offers ───────────────────────────────────────────────────────────────

    def _served_models(self) -> dict[str, dict]:
        """``/models``: the base model first, then its adapters (vLLM lists them after it)."""
        response = self._request("GET", "/models")
        models = {entry["id"]: entry for entry in response.json().get("data", [])}
        if not models:
            raise G4VError(f"the server at {self.base_url} serves no models")
        return models

    def adapters(self) -> list[str]:
        """Served names other than the base model: the server's ``--lora-modules``."""
        return [name for name in self._served if name != self.model]

    def register_adapter(self, name: str, path: str, stacked: bool = False) -> None:
        """Adapters live on the server (and are served as it serves them); this only checks that it serves ``name``."""
        if name not in self.adapters():
            raise G4VError(f"the server at {self.base_url} does not serve adapter {name!r}; "
                           f"start it with --enable-lora --lora-modules {name}={path}")

    def context_window(self) -> int | None:
        return self._served[self.model].get("max_model_len")

    # ── generation ───────────────────────────────────────────────────────────────────────────

    def stream_outputs(self, messages, settings, cancel=None, adapter=None) -> Iterator[Piece]:
        body = self._body(messages, settings, adapter)  # bad input fails here, at the call site
        return without_end_token(self._pieces(body, cancel or threading.Event()))

    def _pieces(self, body: dict, cancel: threading.Event) -> Iterator[Piece]:
        for chunk in self._chunks(body, cancel):
            text, ids, reason, usage = _parse_chunk(chunk)
            yield Piece(text, ids, reason, usage.get("prompt_tokens", 0))

    def _body(self, messages: list[Message], settings: SamplingSettings, adapter: str | None) -> dict:
        messages = messages_of(messages)  # a prepared request carries its conversation
        validate_conversation(messages, context_window=self.context_window())
        settings = settings.validated()
        if adapter is not None and adapter not in self.adapters():
            raise G4VError(f"unknown adapter {adapter!r} (the server serves: {', '.join(self.adapters()) or 'none'})")
        return {
            "model": adapter or self.model,
            "messages": chat_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            **sampling_body(settings),
        }

    def _chunks(self, body: dict, cancel: threading.Event) -> Iterator[dict]:
        """The server-sent events of one streamed completion, as dicts. Leaving early (cancel, or
        the consumer closing the generator) closes the connection, and vLLM aborts the request
        when its client disconnects."""
        try:
            with self._client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise G4VError(self._refusal(response))
                for line in response.iter_lines():
                    if cancel.is_set():
                        return
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise G4VError(f"the server at {self.base_url} sent a malformed event: {data[:80]!r}") from None
                    if "error" in chunk:
                        raise G4VError(f"the server failed mid-answer: {_error_message(chunk)}")
                    yield chunk
        except httpx.HTTPError as err:
            raise G4VError(self._transport_error(err)) from None

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise G4VError(self._transport_error(err)) from None
        if response.status_code >= 400:
            raise G4VError(self._refusal(response))
        return response

    def _transport_error(self, err: httpx.HTTPError) -> str:
        if isinstance(err, httpx.ConnectError):
            return f"cannot reach the server at {self.base_url} (is it running?)"
        if isinstance(err, httpx.TimeoutException):
            return f"the server at {self.base_url} did not answer in time ({type(err).__name__})"
        return f"talking to the server at {self.base_url} failed: {type(err).__name__}: {err}"

    def _refusal(self, response: httpx.Response) -> str:
        try:
            message = _error_message(response.json())
        except ValueError:
            message = response.text[:300] or response.reason_phrase
        return f"the server at {self.base_url} refused the request (HTTP {response.status_code}): {message}"

    def close(self) -> None:
        self._client.close()


def normalise_base_url(base_url: str) -> str:
    """``http://host:port`` and ``http://host:port/v1/`` both mean ``http://host:port/v1``."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise G4VError(f"--base-url must start with http:// or https://, got {base_url!r}")
    return url if url.endswith("/v1") else url + "/v1"


def _parse_chunk(chunk: dict) -> tuple[str, list[int], str | None, dict]:
    """``(text, token_ids, finish_reason, usage)`` of one streamed chunk."""
    usage = chunk.get("usage") or {}
    if not chunk.get("choices"):
        return "", [], None, usage
    choice = chunk["choices"][0]
    text = (choice.get("delta") or {}).get("content") or ""
    return text, list(choice.get("token_ids") or []), choice.get("finish_reason"), usage


def _error_message(payload) -> str:
    """The message in OpenAI's ``{"error": {"message": ...}}`` or vLLM's ``{"message": ...}``."""
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error)
    return str(payload)
