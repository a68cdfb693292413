"""Each request kind's default answer length is the same in its command, its library function and
its tab: read from each (argparse's parsed default, the function's signature, the tab's source)."""

import inspect

from g4v.cli import build_parser
from g4v.conversation import SamplingSettings


def parsed_default(*argv) -> int:
    return build_parser().parse_args(list(argv)).max_new_tokens


def signature_default(function) -> int:
    return inspect.signature(function).parameters["max_new_tokens"].default


def test_commands_and_functions_agree():
    from g4v.inspect.ablation import compare_scaled
    from g4v.inspect.run import run_inspection
    from g4v.lora.token_diff import lora_token_diff
    from g4v.port.in_vllm_env import run_port_diff_in_vllm_env
    from g4v.port.run import run_port_diff

    assert parsed_default("chat", "p") == SamplingSettings().max_new_tokens == 256
    assert parsed_default("inspect", "--image", "i", "--prompt", "p", "--out", "o") \
        == signature_default(run_inspection) == signature_default(compare_scaled) == 16
    assert parsed_default("lora-diff", "--adapter", "a", "--prompt", "p") == signature_default(lora_token_diff) == 48
    assert parsed_default("port-diff", "--image", "i", "--prompt", "p") \
        == signature_default(run_port_diff) == signature_default(run_port_diff_in_vllm_env) == 16
