"""Family adapters: how a backbone that does not read ``[CLS] A [SEP] B [SEP]`` fine-tunes on every task.

``ember.tasks.base.FAMILY_ADAPTERS`` maps a model family to an ``adapt(adapter, model)`` here that
turns an encoder task adapter into that family's: GPT-1/2's input transformations (``gpt``), XLNet's
``A <sep> B <sep> <cls>`` with left padding (``xlnet``), Dai & Le's LSTM classifier (``lstm``), and
any model with language embeddings (``language_ids``, XLM). Beside them, the heads that use a model
another way: ELMo's frozen-feature BiLSTM (``elmo``), feature-based transfer from any encoder
(``feature_transfer``) and knowledge-graph inputs (``knowledge``: K-BERT, ERNIE fusion). T5's family
adapter is ``ember.tasks.text2text.task.adapt``: text to text is a package of its own.

May import: the task heads and adapters above them (``classification``, ``glue_adapter``, ``tagging``,
``wrapped``, ``featurize``), ``ember.tasks.readers`` / ``metrics`` / ``inference``, models, nn and
``ember.knowledge``. A new family adds one module here and one line in ``FAMILY_ADAPTERS``.
"""
