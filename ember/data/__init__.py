"""Corpus readers → sentence splitting → memory-mapped token shards.

Import from the submodules (``ember.data.readers``, ``ember.data.sentences``,
``ember.data.shards``, ``ember.data.prepare``); this package stays import-light so that
readers work without numpy or tokenizers loaded.
"""
