"""What the store raises when the database cannot serve."""


class StoreError(Exception):
    """The database cannot be used: a bad URL, a schema this server cannot work with."""


class StoreUnavailable(StoreError):
    """The database failed to serve (down, unreachable, locked past the busy timeout, out of
    disk; the driver's OperationalError): a server-side failure, not something the client
    sent, that a retry may get past."""
