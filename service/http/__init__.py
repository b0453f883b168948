"""HTTP: the FastAPI app, its routes and schemas, the API dialects (native,
LibreTranslate), middleware, the server process, logging and the web page.
"""
