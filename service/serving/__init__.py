"""Serving: turning requests into engine batches. The scheduler (batching), the model
registry, the request pipeline, the lifecycle, settings, metrics, sentence splitting and the
service's errors. Knows nothing of HTTP; imports the runtime only.
"""
