"""Side effects: storage, runs, model hub, LLM calls, toolchains, kernels, containers.

Modules import heavy libraries (boto3, onnx, onnxruntime, torch, triton) inside functions so a
workflow-only worker or a client never pays for them.
"""
