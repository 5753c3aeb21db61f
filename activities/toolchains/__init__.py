"""Model conversion toolchains: SoC table, versioned tool specs, the plan compiler, and the
in-process onnx / onnxruntime-qnn steps. Heavy libraries are imported inside functions."""
