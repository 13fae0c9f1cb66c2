"""Which strings are one object: pickle writes an object once and refers back to it after.

torch pickles ``.metadata`` on the coordinator from objects it unpickled from each rank's
messages, and unpickled strings are never interned: two equal strings are one object only if
they travelled in one message as one object. To write the same bytes, the generator builds its
strings with the same sharing - never a literal or a name Python interned, which ``pathlib``
would share with a path part of ``checkpoint_id`` (a directory called ``model``, say).
"""

from __future__ import annotations


def fresh(text: str) -> str:
    """An equal string that is a new, uninterned object."""
    return "".join([text[:1], text[1:]]) if len(text) > 1 else text
