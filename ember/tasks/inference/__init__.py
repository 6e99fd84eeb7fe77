"""Inference methods: what a model answers once trained, as the Python API, ``ember predict`` and
``ember serve`` ask it, one method at a time.

Here: the method interface and its dispatch (``methods``), request limits and field checks shared
with the HTTP server (``requests``), embeddings (``embedding``), fill-mask (``fill_mask``), text
generation with a GPT run (``generation``), log-likelihood scoring (``scoring``), zero-/few-shot
prompting (``fewshot``), zero-shot similarity (``similarity``), and what a pre-training run answers
by objective (``pretrained``). A fine-tuned run's methods come from its task head
(``ember.tasks.classification``, ``tagging``, ``qa``, ``text2text.methods``).

May import: ``ember.tasks.readers``, ``ember.tasks.metrics``, the shared plumbing
(``ember.tasks.batching``), models, ``ember.generate`` and run folders; never a task head, adapter or
family adapter (those import this package).
"""
