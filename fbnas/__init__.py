"""fbnas: hardware-aware differentiable neural architecture search in the style of FBNet."""

from fbnas.errors import FbnasError

__version__ = "0.1.0"
__all__ = ["FbnasError", "__version__"]
