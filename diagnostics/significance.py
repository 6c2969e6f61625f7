"""How many interleaved rounds a comparison needs for its interval (measure.compare's statistics), kept free of
torch so that a page can say it (the dashboard's server never imports torch)."""

from __future__ import annotations

#: The intervals' confidence.
CONFIDENCE = 0.95


def min_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest rounds whose sign-flip test can reach ``confidence``: the smallest p-value over n
    rounds is 2 / 2^n (every round's ratio on the same side of 1, one way or the other)."""
    n = 1
    while 2.0 / 2 ** n > 1 - confidence:
        n += 1
    return n


#: Fewer rounds than this give no interval: the verdict is "within noise" and the row says why.
MIN_ROUNDS = min_rounds()
