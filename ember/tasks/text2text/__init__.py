"""Text to text (T5, Raffel et al. 2020 §2.4): every task as input text -> target text, on an encoder-decoder.

Here: the family adapter that turns any task into text to text (``task``), each task's input /
target template and how outputs parse back (``templates``), encoding to token ids (``encoding``),
what a seq2seq run answers at inference (``methods``: generate, classify, answer, score) and your
own input -> target files (``custom``). Decoding itself is ``ember.seq2seq_generation``.

May import: ``ember.tasks.readers``, ``metrics``, ``inference``, ``qa.squad`` and the shared plumbing
(``featurize``, ``batching``, ``base.get_adapter``); it sits above the encoder heads.
"""
