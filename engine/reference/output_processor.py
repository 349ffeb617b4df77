"""Turns sampled tokens into request outputs: incremental detokenisation and the stop rules.

Stop rules, checked in vLLM's order after each new token:
1. EOS (unless ignore_eos), once min_tokens are out; the EOS token is not shown as text.
2. A token in stop_token_ids, once min_tokens are out (stop_reason = that id).
3. A stop string in the text (stop_reason = the string); the text is cut before it unless
   include_stop_str_in_output.
4. max_tokens reached, or the context window is full (finish_reason "length").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.reference.sequence import Sequence, SequenceStatus

# Decoding a growing tail is enough to find new text: older tokens cannot change how it decodes.
_DETOKENIZE_WINDOW = 8
_REPLACEMENT_CHAR = "\ufffd"


@dataclass
class DetokenizerState:
    """Text sent so far for one request, and the token offset that text covers."""

    sent_text: str = ""
    held_back: str = ""  # text that might be the start of a stop string
    read_offset: int = 0  # output tokens whose text is fully in sent_text + held_back
    text: str = field(default="")  # sent_text + held_back, for stop-string search


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_id: int, max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self._states: dict[str, DetokenizerState] = {}

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process_token(self, seq: Sequence) -> tuple[str, SequenceStatus | None]:
        """Called after seq's newest token was appended. Returns (new text to send, finished status or None)."""
        params, token = seq.params, seq.output_token_ids[-1]
        state = self._states.setdefault(seq.request_id, DetokenizerState())
        min_tokens_out = seq.num_output_tokens >= params.min_tokens
        if token == self.eos_token_id and not params.ignore_eos and min_tokens_out:
            return self._flush(state), SequenceStatus.FINISHED_STOPPED
        if token in params.stop_token_ids and min_tokens_out:
            seq.stop_reason = token
            return self._flush(state), SequenceStatus.FINISHED_STOPPED
        self._append_text(seq, state)
        stop = self._find_stop_string(seq, state)
        if stop is not None:
            return stop, SequenceStatus.FINISHED_STOPPED
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return self._flush(state), SequenceStatus.FINISHED_LENGTH_CAPPED
        return self._release(seq, state), None

    def _append_text(self, seq: Sequence, state: DetokenizerState) -> None:
        """Decode the new token(s) against a short window of context so word-piece spacing is right."""
        ids = seq.output_token_ids
        start = max(0, state.read_offset - _DETOKENIZE_WINDOW)
        before = self.tokenizer.decode(ids[start : state.read_offset], skip_special_tokens=True)
        after = self.tokenizer.decode(ids[start:], skip_special_tokens=True)
        if after.endswith(_REPLACEMENT_CHAR):
            return  # an incomplete UTF-8 sequence: wait for the next token
        state.text += after[len(before) :]
        state.read_offset = len(ids)

    def _find_stop_string(self, seq: Sequence, state: DetokenizerState) -> str | None:
        stops = seq.params.stop
        if not stops:
            return None
        longest = max(len(s) for s in stops)
        search_from = max(0, len(state.sent_text) - longest)
        hits = [(state.text.find(s, search_from), s) for s in stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        seq.stop_reason = stop
        end = index + len(stop) if seq.params.include_stop_str_in_output else index
        new_text = state.text[len(state.sent_text) : max(end, len(state.sent_text))]
        state.sent_text = state.text = state.sent_text + new_text
        return new_text

    def _release(self, seq: Sequence, state: DetokenizerState) -> str:
        """Send all new text except a tail that could still grow into a stop string."""
        hold = max((len(s) - 1 for s in seq.params.stop), default=0)
        safe_end = len(state.text) - hold if hold else len(state.text)
        safe_end = max(safe_end, len(state.sent_text))
        new_text = state.text[len(state.sent_text) : safe_end]
        state.sent_text += new_text
        return new_text

    def _flush(self, state: DetokenizerState) -> str:
        new_text = state.text[len(state.sent_text) :]
        state.sent_text = state.text
        return new_text
