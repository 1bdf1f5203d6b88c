"""The data layer's one error type: something about the data or its settings that the user can fix."""


class DataError(ValueError):
    """A problem with the data that the user can fix; the message names the file and the fix."""
