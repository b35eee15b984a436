"""The one exception type the converter raises for bad input: its message is a single line naming the node."""


class ConversionError(Exception):
    """Bad or unsupported input; ``str(err)`` is one line naming the offending node or tensor."""
