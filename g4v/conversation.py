"""What every engine takes: a conversation of messages with images, and sampling settings.

These dataclasses are the engine interface's vocabulary. The app, the CLI and the tests build them;
each backend turns them into its own request (a transformers prompt, a vLLM prompt, an OpenAI
chat-completions body).
"""

from dataclasses import dataclass, field

from PIL import Image

from g4v.errors import G4VError, PromptTooLong, check_fields, share, whole_number

ROLES = ("system", "user", "assistant")

#: Images one message may carry (the app's upload box, the CLI's ``--image`` flags, the API).
MAX_IMAGES_PER_MESSAGE = 4
#: Images one conversation may carry; older turns are dropped past it (each image costs hundreds of
#: tokens and a vision-tower pass on every turn).
MAX_IMAGES_PER_CONVERSATION = 8
#: The longest answer a request may ask for (app, API and CLI).
MAX_NEW_TOKENS = 1024
#: Characters of text allowed per token of the model's context window. A token covers about four
#: characters of ordinary text, so longer text cannot fit; it is refused by its length in characters
#: before any tokenizer sees it (tokenizing costs hundreds of bytes of memory per character: a
#: 100 MB prompt took a server past 18 GB).
CHARS_PER_CONTEXT_TOKEN = 4
#: The context window assumed where a model does not say (a remote server): the real model's.
ASSUMED_CONTEXT_WINDOW = 131072
#: How much of a too-long text tables, exports and messages show.
PREVIEW_CHARS = 200


@dataclass
class Message:
    """One turn. Images come before the text in the prompt, as the app's upload box puts them."""

    role: str
    text: str = ""
    images: list[Image.Image] = field(default_factory=list)


#: A request's ``max_new_tokens``: a whole number from 1 to :data:`MAX_NEW_TOKENS`.
check_answer_length = whole_number(1, MAX_NEW_TOKENS)
#: An inspector's greedy continuation length: a whole number, 0 for none.
check_continuation_length = whole_number(0)


#: The lowest temperature that samples: vLLM raises lower ones to it. Far lower ones (5e-38) overflow
#: the logits they divide to infinity, which no sampler can draw from.
MIN_TEMPERATURE = 0.01


def _check_temperature(value) -> None:
    if not _is_number(value) or not (value == 0 or MIN_TEMPERATURE <= value <= 5):
        raise ValueError(f"must be 0 (greedy) or from {MIN_TEMPERATURE} to 5, got {value!r}")


#: The largest seed (samplers take 32 bits).
MAX_SEED = 2**32 - 1
_check_seed = whole_number(0, MAX_SEED, optional=True)  # None: a fresh seed


@dataclass(frozen=True)
class SamplingSettings:
    """Decoding settings shared by all backends. ``temperature == 0`` means greedy decoding.

    The one place for their defaults and checks: ``chat``'s flags derive from these fields
    (:mod:`g4v.settings.flags`, which runs each field's check on the value typed) and the
    Chat tab's sliders start at them."""

    max_new_tokens: int = field(default=256, metadata={
        "check": check_answer_length, "help": "longest answer, in tokens"})
    temperature: float = field(default=0.0, metadata={
        "check": _check_temperature, "help": "sampling temperature (0 decodes greedily)"})
    top_p: float = field(default=1.0, metadata={
        "check": share(up_to_one=True), "help": "nucleus sampling: the smallest set of tokens holding this "
                                       "much probability (1: all)"})
    seed: int | None = field(default=None, metadata={
        "check": _check_seed, "help": "seed of the sampler (default: a fresh one each run)"})
    min_new_tokens: int = field(default=0, metadata={
        "check": whole_number(0, MAX_NEW_TOKENS), "metavar": "N",
        "help": "shortest answer, in tokens: end-of-text is not picked before (benchmarks time a fixed length)"})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validated(self, max_new_tokens_limit: int | None = None) -> "SamplingSettings":
        """Return self, or raise :class:`G4VError` naming the first bad value (``max_new_tokens_limit``:
        a caller's own limit, below :data:`MAX_NEW_TOKENS`)."""
        check_fields(self)
        if self.min_new_tokens > self.max_new_tokens:
            raise G4VError(f"min_new_tokens ({self.min_new_tokens}) is above max_new_tokens ({self.max_new_tokens})")
        if max_new_tokens_limit is not None and self.max_new_tokens > max_new_tokens_limit:
            raise G4VError(f"max_new_tokens is {self.max_new_tokens}, the limit is {max_new_tokens_limit}")
        return self


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def max_text_chars(context_window: int | None = None) -> int:
    """The most characters of text that may go to a tokenizer for a model with ``context_window``
    tokens (None: :data:`ASSUMED_CONTEXT_WINDOW`)."""
    return CHARS_PER_CONTEXT_TOKEN * (context_window or ASSUMED_CONTEXT_WINDOW)


def text_preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """``text`` as a table or an export may echo it: whole up to ``limit`` characters, else its
    start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters in all)"


def validate_conversation(messages: list[Message], max_images: int | None = None,
                          context_window: int | None = None) -> None:
    """Raise :class:`G4VError` unless ``messages`` is a conversation a model can answer.

    Text is checked against :func:`max_text_chars` of ``context_window``: one message over it is
    refused; where the engine says its window, a conversation over it raises :class:`PromptTooLong`,
    so a chat drops its oldest turns (as it does for a prompt too long in tokens)."""
    if not messages:
        raise G4VError("the conversation is empty")
    limit = max_text_chars(context_window)
    for message in messages:
        if message.role not in ROLES:
            raise G4VError(f"unknown role {message.role!r} (expected one of {', '.join(ROLES)})")
        if message.images and message.role != "user":
            raise G4VError("only user messages can carry images")
        check_text(message.text, limit)
    total = sum(len(m.text) for m in messages)
    if context_window is not None and total > limit:
        raise PromptTooLong(f"the conversation is too long: {total:,} characters of text, the limit is "
                            f"{limit:,} for this model's context window")
    last = messages[-1]
    if last.role != "user":
        raise G4VError("the last message must come from the user")
    if not last.text.strip():
        raise G4VError("the prompt is empty: type a message")
    if max_images is not None:
        count = sum(len(m.images) for m in messages)
        if count > max_images:
            raise G4VError(f"too many images: {count} in this conversation, the limit is {max_images}")


#: The processor expands this placeholder into one token per image feature, so typed text must not
#: contain it: the counts of placeholders and pictures would disagree.
IMAGE_PLACEHOLDER = "<image>"


def check_text(text, limit: int | None = None, what: str = "the message text") -> None:
    """Refuse text a tokenizer cannot take or would misread, with the reason in one line: not a
    string, longer than ``limit`` characters (default :func:`max_text_chars`), not Unicode, or with
    the image placeholder in it. ``what`` names the text in the message."""
    if not isinstance(text, str):
        raise G4VError(f"{what} must be a string, got {type(text).__name__}")
    limit = max_text_chars() if limit is None else limit
    if len(text) > limit:
        raise G4VError(f"{what} is too long: {len(text):,} characters, the limit is {limit:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise G4VError(f"{what} is not valid Unicode at character {err.start + 1} "
                       "(a lone surrogate, or bytes that are not UTF-8)") from None
    if IMAGE_PLACEHOLDER in text:
        # Named in words: a browser shows an error as HTML, where the tag itself would vanish.
        raise G4VError(f"{what} contains the model's image placeholder (the word image in angle brackets): "
                       "attach pictures as files instead, or write it differently")


def to_template_messages(messages: list[Message]) -> tuple[list[dict], list[Image.Image]]:
    """Chat-template messages (content as typed items) and the images in prompt order."""
    template_messages, images = [], []
    for message in messages:
        content = [{"type": "image"} for _ in message.images]
        if message.text:
            content.append({"type": "text", "text": message.text})
        template_messages.append({"role": message.role, "content": content})
        images.extend(message.images)
    return template_messages, images
