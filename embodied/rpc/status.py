"""The status codes of replies, defined once for servers and clients.

A reply's body opens with the request's number and then its status, 8
bytes each (portal's frame): `OK` is followed by the result, any other code
by an error message. The numbers are portal's where portal has them, so
its clients read our errors too (it raises RuntimeError for every code
but `OK`).
"""

OK = 0
UNKNOWN_METHOD = 3  # No method of that name is bound (portal's code).
FAILED = 4          # The method raised while handling the request.
BAD_INPUT = 5       # The server rejected the request's input.
REFUSED = 6         # A verdict frame (`auth`): the handshake was refused.


def header(code):
    """`code` as it stands in a reply, after the request number."""
    return code.to_bytes(8, 'little')


def read(body):
    """The code of a reply's `body` (request number first)."""
    return int.from_bytes(body[8:16], 'little')
