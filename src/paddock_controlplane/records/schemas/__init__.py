"""Request bodies, named exactly as the wire (§10), one module per noun; ``base`` holds what they share.

Pydantic checks types; ``validation`` and the deciding modules check rules. ``None`` is accepted wherever
a client could send ``null`` for "unset". Every body the ``/v1`` API parses is here: the routes and the
OpenAPI contract (``edge/contract.py``) name these models, and the deciding modules take them.
"""
