"""Taking a model elsewhere: safetensors weight files, the PyTorch name and layout map, ONNX export.

``safetensors_file`` and ``torch_names`` need nothing beyond NumPy; ``onnx_export`` needs the
``onnx`` extra (``pip install 'cudnnnet[onnx]'``), imported only when a model is exported.
"""
