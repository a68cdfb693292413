"""Flags for the backends that need settings: how the transformers engine decodes chats (one flag per
field of :class:`~g4v.engines.decode_settings.DecodeSettings`), the remote server's address and key,
and vLLM's own settings under vLLM's own names (so its documentation applies), one flag per field of
:class:`~g4v.engines.vllm_settings.VLLMSettings`. Used with ``--backend`` from
:mod:`g4v.commands.common` by every command that loads an engine, and by ``app.py``."""

import argparse
import os

from g4v.checkpoint.vision_lora import DEFAULT_MODE, MODES
from g4v.engines.decode_settings import DecodeSettings
from g4v.engines.vllm_settings import VLLMSettings
from g4v.settings.flags import add_settings_flags, settings_from_args

#: VLLMSettings fields without a flag of their own: the dtype comes from the shared ``--dtype``,
#: and the image limit is the workbench's (``max_images``).
_NOT_FLAGS = ("dtype", "max_images")


def add_vision_lora_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vision-lora", choices=MODES, default=DEFAULT_MODE,
                        help="how a checkpoint's own vision LoRA is applied (hf, vllm): native = per request, "
                             "to image requests only, as vLLM's --default-mm-loras; merged = into the weights "
                             "at load; off = the base language model")


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    add_vision_lora_flag(parser)
    add_settings_flags(parser.add_argument_group("hf backend (transformers): chat decoding"), DecodeSettings)
    remote = parser.add_argument_group("openai backend (an OpenAI-compatible server such as vllm serve)")
    remote.add_argument("--base-url", default=None, help="the server, e.g. http://127.0.0.1:8000/v1")
    remote.add_argument("--api-key", default=None, help="sent as a bearer token (default: $OPENAI_API_KEY)")
    vllm = parser.add_argument_group("vllm backend (passed to vLLM; see its engine arguments)")
    add_settings_flags(vllm, VLLMSettings, exclude=_NOT_FLAGS)


def engine_options(args: argparse.Namespace) -> dict:
    """``create_engine`` keywords from these flags and ``--device``/``--dtype``.

    Commands print answers and tables on stdout, so vLLM's logging (stdout by default, configured
    when vLLM is first imported, which happens later) is sent to stderr unless the user chose."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

    dtype = getattr(args, "dtype", "auto")
    vllm = settings_from_args(VLLMSettings, args, exclude=_NOT_FLAGS, dtype=None if dtype == "auto" else dtype)
    return {"device": getattr(args, "device", None), "dtype": dtype, "vllm": vllm, "vision_lora": args.vision_lora,
            "base_url": args.base_url, "api_key": args.api_key, "decode": settings_from_args(DecodeSettings, args)}
