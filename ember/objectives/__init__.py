"""Pre-training objectives: each owns its corruption step, its heads and its loss.

An objective is an ``nn.Module`` wrapping a backbone with:
  make_batch(examples, rng) -> dict of tensors   (corruption drawn on the fly)
  forward(batch) -> (loss, metrics)              metrics: name -> (sum, count)
"""
