"""The runtime: an exported bundle on ONNX Runtime. Bundle loading and checks, the engine
(encoder once, then decoder steps with caches), search strategies, the tokenizer and the
translator that ties them together. Used by the CLI, the benchmarks and the server.

Imports onnxruntime, numpy and sentencepiece; never torch, never the serving or HTTP layers.
"""
