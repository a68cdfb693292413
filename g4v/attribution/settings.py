"""What an attribution request is asked: :class:`AttributionSettings`, the one place for its defaults.

``python -m g4v attribute`` derives its flags from the fields (:mod:`g4v.settings.flags`:
help, choices, metavar, nargs, parse and check in each field's metadata), the Attribution tab
builds the object, and :func:`g4v.attribution.run.run_attribution` takes it. No torch here, so the
command's flags cost no import; the gradient and deletion modules take their defaults from here.
"""

from dataclasses import dataclass, field

from g4v.conversation import check_text, max_text_chars
from g4v.errors import G4VError, NumberError, check_fields, quoted, read_whole, whole_number

METHODS = ("gradxinput", "ig")
DEFAULT_IG_STEPS = 16  # path points for integrated gradients (Captum's Gauss-Legendre rule)
DEFAULT_FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
DEFAULT_SEEDS = 3
#: The ranges the settings allow, which the gradient and deletion functions check again when called directly.
check_steps = whole_number(2, 512)
check_seeds = whole_number(1, 50)
#: How the tokens are ranked for removal: ``positive`` by the evidence *for* the target a token
#: brings through its levels (each level's score clipped at 0, then summed), ``signed`` by its net
#: score (the levels' scores summed, so a level that argues against hides one that argues for).
#: ``positive`` was chosen on validation pictures (docs/attribution.md has both on held-out ones).
RANKINGS = ("positive", "signed")
DEFAULT_RANKING = "positive"
#: Bounds on the answers to contrast with: each is one more sequence in every forward pass.
MAX_ALTERNATIVES = 16
MAX_ALTERNATIVE_CHARS = 200
#: The longest answer explained, in tokens (a greedy answer's ``max_new_tokens`` or a typed target):
#: every forward pass keeps a vocabulary-wide row of logits per answer token and sequence.
MAX_ANSWER_TOKENS = 256


def check_fractions(fractions) -> list[float]:
    fractions = sorted({float(f) for f in fractions})
    if len(fractions) < 2 or not all(0.0 <= f <= 1.0 for f in fractions):
        raise G4VError(f"deletion fractions must be at least two numbers from 0 to 1, got {fractions}")
    return fractions


def read_token(text: str) -> int | None:
    """``--token`` as typed: a whole number, or ``all`` (None: the whole answer)."""
    if text.strip().lower() == "all":
        return None
    try:
        return read_whole(text)
    except NumberError:
        raise NumberError(f"must be a whole number or 'all' (digits 0-9), got {quoted(text)}") from None


@dataclass
class AttributionSettings:
    """What to explain and how; every default is written here once (the CLI's flags come from it)."""

    target: str | None = field(default=None, metadata={
        "metavar": "TEXT", "help": "answer text to explain (default: the model's own greedy answer)"})
    token: int | None = field(default=0, metadata={
        "parse": read_token, "metavar": "N|all",
        "help": "answer token to explain (0 = first), or 'all' for the whole answer; "
                "not with --against, which explains the whole answer"})
    against: tuple = field(default=(), metadata={
        "nargs": "+", "metavar": "TEXT",
        "help": "explain the whole answer's log-odds against these other answers (contrast)"})
    method: str = field(default="gradxinput", metadata={"choices": METHODS, "help": "attribution method"})
    steps: int = field(default=DEFAULT_IG_STEPS, metadata={
        "check": check_steps, "help": "integrated-gradient steps"})
    deletion_level: str | None = field(default=None, metadata={
        "metavar": "LEVEL", "help": "remove tokens at this level only in the deletion test (default: all levels)"})
    deletion_ranking: str = field(default=DEFAULT_RANKING, metadata={
        "choices": RANKINGS, "help": "remove first the tokens with the most evidence for the target (positive: "
                                     "each level's score clipped at 0) or the highest net score (signed)"})
    fractions: tuple = DEFAULT_FRACTIONS  # shares of tokens the deletion test removes (no flag)
    seeds: int = field(default=DEFAULT_SEEDS, metadata={
        "check": check_seeds, "help": "random orders in the deletion test"})
    lens: bool = field(default=True, metadata={"flag": "--no-lens", "help": "skip the logit lens"})
    max_new_tokens: int = field(default=16, metadata={
        "check": whole_number(1, MAX_ANSWER_TOKENS), "help": "length of the greedy answer when no --target is given"})

    def checked(self) -> "AttributionSettings":
        if self.method not in METHODS:
            raise G4VError(f"unknown attribution method {self.method!r} (expected one of {', '.join(METHODS)})")
        check_fields(self)
        if self.target is not None:  # by characters first: a tokenizer would take any length
            check_text(self.target, max_text_chars(MAX_ANSWER_TOKENS), "the answer to explain")
        check_fractions(self.fractions)
        if self.deletion_ranking not in RANKINGS:
            raise G4VError(f"unknown deletion ranking {self.deletion_ranking!r} (expected one of {', '.join(RANKINGS)})")
        if len(self.against) > MAX_ALTERNATIVES:
            raise G4VError(f"at most {MAX_ALTERNATIVES} answers to contrast with, got {len(self.against)}")
        for text in self.against:
            if not isinstance(text, str) or not text.strip():
                raise G4VError("an answer to contrast with is empty")
            check_text(text, MAX_ALTERNATIVE_CHARS, "an answer to contrast with")
        return self
