"""Serving: turning requests into engine batches. Request handling (requests.py), the waiting
queue (queue.py), the one decoding loop (loop.py), the model registry (registry.py), the
lifecycle, settings, metrics, sentence splitting and the service's errors. Knows nothing of
HTTP; imports the runtime only.
"""
