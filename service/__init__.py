"""Online side of nmt-serve: bundle loading, the ONNX Runtime engine and decoding, the HTTP app.

Never imports torch: the serving image does not have it.
"""
