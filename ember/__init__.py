"""ember: pre-train, fine-tune, evaluate, distil and serve BERT-era language models."""

__version__ = "0.1.0"
