"""Model references: what the model hub resolves a user's model reference into."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

from contracts.common import ArtifactRef


class ModelFormat(StrEnum):
    ONNX = "onnx"
    TFLITE = "tflite"
    TF_PB = "pb"
    SAVED_MODEL = "saved_model"
    TORCH = "pt"
    """TorchScript (torch.jit.save)."""
    TORCH_EXPORT = "pt2"
    """An ExportedProgram (torch.export.save)."""


class TensorSpec(BaseModel, frozen=True):
    name: str
    dtype: str
    shape: list[int | str]
    """Static dims as ints, symbolic dims by name."""


class OnnxInfo(BaseModel, frozen=True):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: int
    ir_version: int
    producer: str = ""
    node_count: int = 0


class ModelRef(BaseModel, frozen=True):
    """An immutable, resolved model: where it came from, what it is, and its bytes in the store."""

    name: str
    source: str
    """The reference the user gave (path, URI or catalog name)."""
    format: ModelFormat
    sha256: str
    size: int
    artifact: ArtifactRef
    """The model's bytes in the artifact store (any worker can fetch them)."""
    filename: str
    """File name used inside a workspace's input/ folder."""
    onnx: OnnxInfo | None = None
    sidecars: list[ArtifactRef] = []
    """Files the model needs beside it in input/ (an ONNX model's external data, e.g. `m.onnx.data`):
    each ref's `name` is its path relative to the model's folder."""
