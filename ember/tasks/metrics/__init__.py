"""Official metrics, in plain numpy (no sklearn / scipy at run time).

Here: GLUE's classification and regression metrics by task (``classification``: accuracy, F1,
Matthews correlation, Pearson / Spearman), CoNLL-2003's entity-level F1 (``ner``), SQuAD 1.1 / 2.0
EM / F1 and the no-answer threshold exactly as the official script computes them (``squad``), and
free-text scores for generation: BLEU, ROUGE-1/2/L/Lsum (``text``).

May import: ``ember.errors`` and ``ember.tasks.readers`` (a task spec names its metric); nothing
that runs a model.
"""
