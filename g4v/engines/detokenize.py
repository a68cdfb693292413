"""Token ids to text as they arrive, at a constant cost per token.

transformers' ``TextIteratorStreamer`` decodes in the generating thread, every token, the whole run
of tokens since the last line break: the decode loop waits for it, and a long line costs more per
token the longer it gets. Here the generating side only hands over token ids; the consumer's own
thread turns them into text with :class:`IncrementalText`, which decodes a window of a few tokens
per step (the method vLLM and text-generation-inference use).

A byte-level BPE token can end inside a UTF-8 character (``"日"`` is three tokens here), so a piece
is held back while its text ends in the replacement character; :meth:`IncrementalText.finish`
returns what is left, so the pieces always add up to the answer decoded in one go.
"""

DECODE = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}

_REPLACEMENT = "\ufffd"


class IncrementalText:
    """The text of a growing list of token ids, piece by piece."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = ""  # the text handed out so far
        self._prefix = 0  # tokens before this one are settled into ``sent``
        self._read = 0  # tokens before this one have been read into ``sent``

    def add(self, token_ids: list[int]) -> str:
        """The new text that ``token_ids`` complete ("" while a character is still unfinished)."""
        self.tokens.extend(token_ids)
        before = self.tokenizer.decode(self.tokens[self._prefix:self._read], **DECODE)
        after = self.tokenizer.decode(self.tokens[self._prefix:], **DECODE)
        if len(after) <= len(before) or after.endswith(_REPLACEMENT) or not after.startswith(before):
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        piece = after[len(before):]
        self.sent += piece
        return piece

    def finish(self) -> str:
        """The rest of the text once no token follows: the whole answer decoded in one go, less
        what was handed out."""
        whole = self.tokenizer.decode(self.tokens, **DECODE)
        rest = whole[len(self.sent):] if whole.startswith(self.sent) else ""
        self.sent += rest
        return rest
