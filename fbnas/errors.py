"""The project's one error type: a one-line message naming the file, key or value at fault."""

import re

# Every line boundary str.splitlines() knows: \n, \r (and \r\n), \v, \f, the file, group and
# record separators \x1c-\x1e, NEL \x85, and the Unicode line and paragraph separators.
_LINE_BREAKS = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def first_line(e: BaseException) -> str:
    """The first non-blank line of an exception's message (its type name if it has none), at
    most 200 characters: what a one-line error quotes of a library's failure."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:200]


class FbnasError(ValueError):
    """Bad input or state, explained in one line (the CLI prints it and exits with status 2).

    Any line break in the message (from a hostile file name, key or value) becomes a space.
    """

    def __init__(self, message: str):
        super().__init__(_LINE_BREAKS.sub(" ", str(message)))
