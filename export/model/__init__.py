"""A Marian-shaped encoder-decoder Transformer in torch."""
