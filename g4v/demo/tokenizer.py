"""The bundled checkpoint's tokenizer and chat template.

A real byte-level BPE tokenizer, trained with the ``tokenizers`` library on a small fixed corpus, so
that every string round-trips (bytes never become unknown tokens) and the words the demo model talks
about (colours, shapes, places, numbers) are single tokens or close to it.
"""

import itertools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|end_of_text|>"
START_OF_ROLE = "<|start_of_role|>"
END_OF_ROLE = "<|end_of_role|>"
PAD = "<|pad|>"
IMAGE = "<image>"
#: Order fixes the ids: 0, 1, 2, ...
SPECIAL_TOKENS = [END_OF_TEXT, START_OF_ROLE, END_OF_ROLE, PAD, IMAGE]

VOCAB_SIZE = 1024

# Granite's chat format: each turn is <|start_of_role|>ROLE<|end_of_role|>CONTENT<|end_of_text|>.
# Content is either a string or a list of {"type": "image"} / {"type": "text", "text": ...} items,
# the form both transformers' processor and vLLM's OpenAI server pass; each image becomes one
# "<image>" placeholder that the processor expands to one token per visual feature.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|start_of_role|>{{ message['role'] }}<|end_of_role|>"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or item['type'] == 'image_url' -%}<image>{{ '\\n' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "<|end_of_text|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start_of_role|>assistant<|end_of_role|>{%- endif -%}"
)

_COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "pink", "brown", "black", "white",
            "gray", "cyan", "rouge", "vert", "bleu", "jaune", "violet", "rose", "noir", "blanc"]
_SHAPES = ["circle", "square", "triangle", "star", "rectangle", "diamond", "cross", "heart"]
_PLACES = ["left", "right", "top", "bottom", "center", "middle", "corner", "upper", "lower"]
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
_WORDS = (
    "the a an is are there what which where how many of in on at to and or with this that it "
    "image picture photo shape shapes colour color answer question describe see shown show "
    "I you can do does not yes no hello hi thanks please model vision granite assistant user system "
    "small large big tiny text token tokens tile tiles grid row column page document chart table"
).split()


def _corpus() -> list[str]:
    """A fixed list of sentences: the same on every machine, so training is reproducible."""
    lines = []
    for colour, shape, place in itertools.product(_COLOURS, _SHAPES, _PLACES):
        lines.append(f"There is a {colour} {shape} at the {place}. The {shape} is {colour}.")
    for number, shape in itertools.product(_NUMBERS, _SHAPES):
        lines.append(f"How many shapes are there? There are {number} {shape}s.")
    lines.append(" ".join(_WORDS) + " " + " ".join(w.capitalize() for w in _WORDS))
    lines.append("0123456789 .,;:!?'\"()[]{}-+*/=<>_#%&@\n\t")
    return lines


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[START_OF_ROLE, END_OF_ROLE, IMAGE],
        padding_side="left",
        model_max_length=4096,
        chat_template=CHAT_TEMPLATE,
    )
