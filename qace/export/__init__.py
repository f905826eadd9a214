"""ONNX export of the QACE models (optional extra ``onnx``): graphs, validation, cache, ``qace export``.

Import the submodules directly (``qace.export.exporter.export_model``, ``qace.export.cache.ensure_export``);
this package stays import-light so ``qace.cli`` can probe it cheaply.
"""
