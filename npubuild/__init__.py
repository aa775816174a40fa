"""npubuild: a declarative, incremental compiler that deploys ONNX models on NPUs."""

__version__ = "0.1.0"
