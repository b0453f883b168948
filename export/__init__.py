"""Offline side of nmt-serve: the torch Transformer, training, evaluation and ONNX export."""
