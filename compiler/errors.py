"""The errors Kiln raises to its users: each says what is wrong and where."""


class KilnError(Exception):
    """Base of Kiln's user-facing errors."""


class ModelError(KilnError):
    """A malformed, corrupt or inconsistent model."""


class UnsupportedError(KilnError):
    """A model that uses something Kiln does not support (op, opset, attribute, element type)."""


class InputError(KilnError, ValueError):
    """Inputs that do not match a model's signature (name, element type, rank, dimension)."""


class LimitError(KilnError):
    """A model past one of Kiln's limits (memory, node count, nesting depth): each limit is an option."""


class DataError(KilnError):
    """Data given to the compiler that does not fit the model (calibration samples): a pass that reads
    it raises this, and the pass manager reports it as is, not as the pass failing."""
