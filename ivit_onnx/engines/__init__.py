"""The engines that run an integer model fast, one folder each: :mod:`.onnxruntime` (the custom-op library
and its exact rewrites, compiled to an ``.onnx`` artifact) and TVM (``ivit_onnx.engines.tvm``: CUDA int8 and
llvm builds).

``ivit-onnx compile int.onnx --engine E`` writes an engine's artifact, ``ivit-onnx run`` and
:class:`ivit_onnx.InferenceSession` run either, ``ivit-onnx bench`` times them against the float model.
"""
