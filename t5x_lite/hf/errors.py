"""The one error a conversion raises for bad input (it names the tensor or config field)."""

from t5x_lite.errors import UserError


class ConversionError(UserError, ValueError):
    """A model folder or checkpoint cannot be converted: unsupported architecture or option, a
    missing or unexpected tensor, or sizes in the config that disagree with the tensors."""
