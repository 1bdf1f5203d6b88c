"""Taking a trained model out of this package: ONNX graphs for a runtime without PyTorch, and a Hub folder."""

from nmt.export.export_job import ExportError, ExportSettings, export_main

__all__ = ["ExportError", "ExportSettings", "export_main"]
