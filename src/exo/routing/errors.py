"""What can go wrong when using the router, as exception types."""


class RoutingError(Exception):
    pass


class RouterClosed(RoutingError):
    """The router is not open (not entered yet, or already closed)."""


class RequestError(RoutingError):
    pass


class RequestTimeout(RequestError, TimeoutError):
    """No valid reply came before the deadline."""


class NoReply(RequestError):
    """The request finished without a valid reply: no node serves it (yet), or every
    reply failed authentication."""


class RemoteError(RequestError):
    """The serving node's handler failed; the message is its error, as text."""
