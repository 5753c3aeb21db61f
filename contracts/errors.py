"""Stable error codes: `ApplicationError.type` in activities, `Failure.code` in results, CLI remedies."""

from __future__ import annotations

from enum import StrEnum


class Err(StrEnum):
    # inputs
    BAD_INPUT = "BAD_INPUT"
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
    MODEL_INVALID = "MODEL_INVALID"
    CATALOG_INVALID = "CATALOG_INVALID"
    # storage
    STORE_URL_INVALID = "STORE_URL_INVALID"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    ARTIFACT_NOT_FOUND = "ARTIFACT_NOT_FOUND"
    INTEGRITY_ERROR = "INTEGRITY_ERROR"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    PATH_ESCAPE = "PATH_ESCAPE"
    # temporal / client
    TEMPORAL_UNAVAILABLE = "TEMPORAL_UNAVAILABLE"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    JOB_CANCELLED = "JOB_CANCELLED"
    # llm
    LLM_UNAVAILABLE = "LLM_UNAVAILABLE"
    LLM_RETRYABLE = "LLM_RETRYABLE"
    LLM_BAD_REQUEST = "LLM_BAD_REQUEST"
    LLM_AUTH = "LLM_AUTH"
    LLM_STREAM_INCOMPLETE = "LLM_STREAM_INCOMPLETE"
    LLM_OUTPUT_INVALID = "LLM_OUTPUT_INVALID"
    # convert
    PLAN_INVALID = "PLAN_INVALID"
    COMPILER_ERROR = "COMPILER_ERROR"
    EXECUTOR_ERROR = "EXECUTOR_ERROR"
    EVALUATION_ERROR = "EVALUATION_ERROR"
    REPLANS_EXHAUSTED = "REPLANS_EXHAUSTED"
    TOOLCHAIN_UNAVAILABLE = "TOOLCHAIN_UNAVAILABLE"
    NEEDS_INPUT_TIMEOUT = "NEEDS_INPUT_TIMEOUT"
    # kernel
    KERNEL_TASK_INVALID = "KERNEL_TASK_INVALID"
    WORKFLOW_CONFIG_INVALID = "WORKFLOW_CONFIG_INVALID"
    VERIFIER_ERROR = "VERIFIER_ERROR"
    MAX_STEPS = "MAX_STEPS"
    PARSE_FAILED = "PARSE_FAILED"
    NO_OPTIONS = "NO_OPTIONS"
    NOT_VERIFIED = "NOT_VERIFIED"
    # fleet
    MANIFEST_INVALID = "MANIFEST_INVALID"
    POLICY_REJECTED = "POLICY_REJECTED"
    RUNNER_UNAVAILABLE = "RUNNER_UNAVAILABLE"
    ROWS_FAILED = "ROWS_FAILED"
    MANIFEST_CHANGED = "MANIFEST_CHANGED"
    # anything else
    INTERNAL = "INTERNAL"


REMEDY: dict[Err, str] = {
    Err.BAD_INPUT: "check the arguments (fleetforge COMMAND --help)",
    Err.MODEL_NOT_FOUND: "check the path, or add the model to the catalog (FLEETFORGE_CATALOG)",
    Err.MODEL_INVALID: "the file is not a readable model of a supported format (onnx, tflite, pb, pt)",
    Err.CATALOG_INVALID: "fix the catalog YAML: a mapping `models: {name: {path: ...}}`",
    Err.STORE_URL_INVALID: "set FLEETFORGE_STORE_URL to file:///ABS/PATH or s3://BUCKET[/PREFIX]",
    Err.STORE_UNAVAILABLE: "check FLEETFORGE_S3_ENDPOINT and the AWS_* credentials, and that the bucket exists",
    Err.TEMPORAL_UNAVAILABLE: "start the embedded stack with `fleetforge dev`, or set FLEETFORGE_TEMPORAL_ADDRESS",
    Err.JOB_NOT_FOUND: "list jobs with `fleetforge list`",
    Err.LLM_UNAVAILABLE: "set FLEETFORGE_LLM_BASE_URL / FLEETFORGE_LLM_API_KEY, or use FLEETFORGE_LLM=offline",
    Err.LLM_AUTH: "check FLEETFORGE_LLM_API_KEY (or OPENAI_API_KEY)",
    Err.TOOLCHAIN_UNAVAILABLE: "install the extra (pip install 'fleetforge[toolchains]') or set QAIRT_SDK_ROOT",
    Err.WORKFLOW_CONFIG_INVALID: "fix the workflow.yaml named in the message",
    Err.MANIFEST_INVALID: "the CSV needs a header with at least model_name,status,note",
    Err.ROWS_FAILED: "see the per-model table: No = the model failed, Error = it could not be tested; rerun the CSV to retest the Error rows",
    Err.MANIFEST_CHANGED: "give the CSV the fleet started from, or pass --force to merge the verdicts into this one by model name",
    Err.MAX_STEPS: "raise --max-step, or configure an LLM (FLEETFORGE_LLM_BASE_URL) for ops the offline coder cannot write",
}


def remedy(code: str) -> str:
    """What the user should do about an error code; empty when we have nothing useful to say."""
    try:
        return REMEDY.get(Err(code), "")
    except ValueError:
        return ""


class FleetforgeError(Exception):
    """A failure with a stable code. The worker's interceptor turns it into an ApplicationError
    (type=code), so library code below activities never imports temporalio."""

    def __init__(self, code: Err, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable

    def __str__(self) -> str:
        return self.message
