"""The PyTorch frontend: core-ATen FX graphs to Kiln's IR (``import_fx``), one lowering per ATen op
(``lowerings.LOWERINGS``). The ``torch.compile`` backend that partitions, compiles and runs them is
``compiler.torch_backend`` (the driver layer: this package only builds IR); see docs/torch.md."""
from .exported import import_exported
from .importer import import_fx, supported
from .lowerings import LOWERINGS, Unsupported

__all__ = ["LOWERINGS", "Unsupported", "import_exported", "import_fx", "supported"]
