"""Readers: the files a task's examples come from, turned into examples, with one clear error per bad line.

Here: the GLUE-style task specs and their strict TSV readers (``glue``), CoNLL-2003 columns
(``conll``), a user's CSV / TSV / JSON Lines / ``datasets`` files as rows of named fields
(``table_files``, ``custom_files``, ``hf_datasets``), in-memory examples written back in a task's
layout (``task_files``), ``ember predict``'s JSON Lines (``jsonl_input``) and the texts ``ember embed``
reads (``embed_input``). SQuAD's JSON reader sits with its windows in ``ember.tasks.qa.squad``.

May import: ``ember.errors``, ``ember.fileio``, ``ember.paths`` and each other; nothing else of
``ember.tasks`` (readers are the bottom floor of the tasks: metrics, heads and adapters read them).
A new table format for your own files is a suffix in ``table_files.FORMATS`` and its row reader there;
a new built-in task's reader is one module here, its adapter named in ``ember.tasks.base``'s registry.
"""
