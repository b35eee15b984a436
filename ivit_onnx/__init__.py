"""ivit-onnx."""
