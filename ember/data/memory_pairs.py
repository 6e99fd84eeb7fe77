"""XLNet pre-training examples: a segment pair with the text before it as memory.

XLNet (Yang et al. 2019, §2.5 and its data pipeline) reads the corpus as one stream
(``ember.data.blocks.TokenStream``: documents joined by an end-of-document token), builds
sequences ``A <sep> B <sep> <cls>`` and carries Transformer-XL memory from the previous
segment of the stream. Its code keeps that memory across training steps, so a batch depends
on the batches before it. Here every example brings its own memory instead: example i is

    memory = stream[s - M, s)        M = model.mem_len tokens, run first without gradient
    window = stream[s, s + L)        L = data.max_seq_length - 3, s = M + i * L

The window is cut into A and B at a random sentence boundary inside it (a random position if
it has none); B is the rest of the window, or - with probability ``random_segment_prob``, as
XLNet samples "two segments (either from the same context or not)" (§2.5) - as many tokens
from a random place of the stream. So each window token is in exactly one example per epoch,
the memory is the real text before A, and an example is a pure function of (index, epoch,
seed): batches do not depend on earlier steps, which keeps resume and DDP exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.data.blocks import TokenStream
from ember.errors import EmberError

_TAG = 0x584C4E  # keeps this example RNG stream apart from other seeded streams


@dataclass
class MemoryPair:
    memory: np.ndarray  # (M,) int64: the stream just before A
    tokens_a: np.ndarray  # (La,) int64
    tokens_b: np.ndarray  # (Lb,) int64, La + Lb = L
    b_follows: bool  # True: B continues A; False: B was taken from a random place


class MemorySegmentPairs:
    """Index -> ``MemoryPair``; ``len`` = number of windows of L tokens after the first M."""

    pair_mode = "none"

    def __init__(self, corpus, eot_id: int, window: int, mem_len: int,
                 random_segment_prob: float = 0.5, seed: int = 0) -> None:
        if window < 2:
            raise EmberError(f"a segment pair needs at least 2 tokens between <sep> <sep> <cls>; "
                             f"got {window} (raise data.max_seq_length to at least 5)")
        if not 0.0 <= random_segment_prob <= 1.0:
            raise EmberError(f"plm.random_segment_prob={random_segment_prob} must be in [0, 1]")
        self.stream = TokenStream(corpus, eot_id)
        self.window, self.mem_len = window, mem_len
        self.random_segment_prob, self.seed = random_segment_prob, seed
        self._boundaries = self.stream.sentence_boundaries()  # (S,) sorted stream offsets
        if len(self) < 1:
            raise EmberError(f"{corpus!r} has {self.stream.num_tokens} tokens with end-of-text tokens, "
                             f"fewer than memory ({mem_len}) + one window ({window}); use more "
                             "documents, a shorter data.max_seq_length or a smaller model.mem_len")

    def __len__(self) -> int:
        return max(0, (self.stream.num_tokens - self.mem_len) // self.window)

    def example(self, index: int, epoch: int = 0) -> MemoryPair:
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} out of range [0, {len(self)})")
        start = self.mem_len + index * self.window
        stop = start + self.window
        rng = np.random.default_rng([self.seed, index, epoch, _TAG])
        lo, hi = np.searchsorted(self._boundaries, [start, stop], side="right")
        cuts = self._boundaries[lo:hi]
        cuts = cuts[cuts < stop] - start  # sentence boundaries strictly inside the window
        cut = int(rng.choice(cuts)) if len(cuts) else int(rng.integers(1, self.window))
        window = self.stream.slice(start, stop)
        memory = self.stream.slice(start - self.mem_len, start)
        if rng.random() < self.random_segment_prob:
            b_len = self.window - cut
            b_start = int(rng.integers(0, self.stream.num_tokens - b_len + 1))
            return MemoryPair(memory, window[:cut], self.stream.slice(b_start, b_start + b_len), False)
        return MemoryPair(memory, window[:cut], window[cut:], True)
