"""Prompt-lookup (n-gram) drafting: speculative decoding without a second model.

The drafter looks for the most recent earlier occurrence of the sequence's last
n tokens (longest n first) and proposes the tokens that followed it. Greedy
verification in the engine accepts the longest prefix of the draft that the
model agrees with, plus the model's own next token, so the output is the same
as plain greedy decoding whatever the drafter proposes.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramDrafter:
    """Proposes up to `k` tokens by matching the last `max_ngram` .. `min_ngram`
    tokens against the earlier sequence. Stateless; `propose` has no side effects."""

    def __init__(self, k: int, max_ngram: int = 3, min_ngram: int = 1):
        if k < 1 or min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"bad drafter settings k={k}, ngram {min_ngram}..{max_ngram}")
        self.k, self.max_ngram, self.min_ngram = k, max_ngram, min_ngram

    def propose(self, tokens: Sequence[int], limit: int | None = None) -> list[int]:
        """Draft tokens to follow `tokens` (at most `min(k, limit)`, maybe none)."""
        k = self.k if limit is None else min(self.k, limit)
        if k <= 0:
            return []
        seq = list(tokens)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            # Latest earlier match first: recent context predicts best.
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == tail:
                    follow = seq[start + n : start + n + k]
                    if follow:
                        return follow
        return []
