"""Documents: translation of text that comes wrapped in a format, on top of the serving layer.

Each format is an adapter: file -> segments with inline markup -> translated through the
pipeline -> the same file, its markup carried to the words it wrapped. Today that is `markup`
(HTML and XML inline tags, carried by the decoder's cross-attention alignment); the office and
subtitle formats (docx, pptx, xlsx, odt, srt, xliff) are to come here, built on it.

A layer below HTTP: it imports the serving layer (and the store), never FastAPI, Starlette or
`service.http` (tests/test_architecture.py checks this), so that a dialect, a batch job or a
command-line tool can translate a document alike; each dialect turns its errors (MarkupError,
the service's errors) into its own answers.
"""
