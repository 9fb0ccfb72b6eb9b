"""The ONNX frontend: import ONNX models as Kiln graphs and export graphs back to ONNX."""
from .importer import import_model, load_proto
from .exporter import export_model

__all__ = ["import_model", "export_model", "load_proto"]
