"""The root of faultwatch's own exceptions.

Every exception the project defines derives from :class:`FaultwatchError`, so a caller can catch
"anything faultwatch refused" in one clause, while each class keeps its standard base as well
(``ValueError`` for bad input, ``RuntimeError`` for an unavailable resource) and existing handlers
still match. It lives in ``schemas`` because that is the lowest layer: every other package may
import it.
"""

from __future__ import annotations


class FaultwatchError(Exception):
    """Base of every exception faultwatch defines; its message names the key or input at fault."""
