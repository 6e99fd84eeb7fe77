"""Knowledge graphs in the encoder: K-BERT (Liu et al. 2020) and ERNIE's fusion (Zhang et al. 2019).

    graph.py     triples files (head<TAB>relation<TAB>tail), read with file:line errors
    wordnet.py   WordNet 3.0's database -> triples (`ember kg build --wordnet DIR`)
    matching.py  entity names found in a sentence: longest match over words
    kbert.py     K-BERT's sentence tree flattened: soft positions and the visible matrix
    inputs.py    text + graph / entity vocabulary -> model inputs for any tokenizer
    transe.py    TransE entity embeddings (`ember kg embed`)
    entities.py  entity vocabulary + vectors on disk (ember's and OpenKE's layouts)
    ernie.py     FusionEncoder: an encoder whose top layers are ERNIE's aggregators

A floor beside tasks and objectives: it builds on nn/models/tokenizers and never imports the
tasks, objectives or trainer that use it (tests/test_layering.py). Fine-tuning with knowledge
is wired in ``ember.tasks.families.knowledge``, the dEA objective in ``ember.objectives.ernie``.
"""
