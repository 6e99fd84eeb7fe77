"""Extractive question answering: SQuAD 1.1 / 2.0 read strictly, cut into stride windows, a start/end
head on any encoder with n-best span decoding, and the ``--task squad`` / ``squad2`` adapter.

Here: ``squad`` (JSON reader, the article-level split, windows), ``head`` (the span head and
decoding), ``task`` (the task adapter, with the tuned no-answer threshold). Its metrics are
``ember.tasks.metrics.squad``.

May import: ``ember.tasks.readers``, ``ember.tasks.metrics``, ``ember.tasks.inference`` and the shared
plumbing (``featurize``, ``batching``); not the registry (``base``), other heads or family adapters.
"""
