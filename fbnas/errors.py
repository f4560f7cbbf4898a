"""The project's one error type: a one-line message naming the file, key or value at fault."""


class FbnasError(ValueError):
    """Bad input or state, explained in one line (the CLI prints it and exits with status 2)."""

    def __init__(self, message: str):
        super().__init__(str(message).replace("\n", " "))
