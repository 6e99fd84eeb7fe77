"""Building blocks shared by every model family (attention, feed-forward, embeddings, heads,
the next-token LM loss)."""
