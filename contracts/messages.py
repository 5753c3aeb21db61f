"""Provider-neutral LLM vocabulary: one `Message` shape every provider response is normalised into,
and the request/result contracts of the LLM activity."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from contracts.common import ArtifactRef


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ReasoningBlock(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    text: str


class ToolCallBlock(BaseModel):
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: str = ""
    """The JSON text exactly as the model produced it (parsed and validated by the caller)."""


class ToolResultBlock(BaseModel):
    type: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    content: str
    is_error: bool = False


ContentBlock = Annotated[TextBlock | ReasoningBlock | ToolCallBlock | ToolResultBlock, Field(discriminator="type")]


class TokenUsage(BaseModel):
    prompt: int = 0
    completion: int = 0
    total: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0
    reported: bool = True
    """False: the server sent no usage for (part of) this call, e.g. a stream without a usage chunk. The
    counts then miss that part because it is unknown, not because it was free."""

    def __add__(self, other: "TokenUsage") -> "TokenUsage":
        return TokenUsage(
            prompt=self.prompt + other.prompt, completion=self.completion + other.completion,
            total=self.total + other.total, reasoning=self.reasoning + other.reasoning,
            cache_read=self.cache_read + other.cache_read, cache_write=self.cache_write + other.cache_write,
            reported=self.reported and other.reported,
        )


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"] = "assistant"
    content: list[ContentBlock] = Field(default_factory=list)
    delta: bool = False
    """True for a streaming partial; the consolidated message of a stream has delta=False."""
    tool_calls: list[ToolCallBlock] = Field(default_factory=list)
    usage: TokenUsage | None = None
    finish_reason: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def reasoning(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, ReasoningBlock))

    @classmethod
    def system(cls, text: str) -> "Message":
        return cls(role="system", content=[TextBlock(text=text)])

    @classmethod
    def user(cls, text: str) -> "Message":
        return cls(role="user", content=[TextBlock(text=text)])


class ToolDefinition(BaseModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ChatRequest(BaseModel):
    messages: list[Message]
    tools: list[ToolDefinition] = Field(default_factory=list)
    model: str | None = None
    """None: the worker's configured model (settings.llm_model)."""
    temperature: float | None = None
    max_tokens: int | None = None
    stream: bool = True
    response_schema: dict[str, Any] | None = None
    """JSON schema of the expected answer: sent as response_format json_schema where the endpoint takes
    it, else json_object / plain instructions (the caller validates the answer either way)."""
    agent: str = "chat"
    live: bool = False
    """Publish the streamed answer's text to the calling workflow's live events as it arrives (the
    workflow hosts a JobEvents stream; activities/llm/live.py)."""


class ChatResult(BaseModel):
    message: Message
    """The answer. When `unusable` is set it carries no text and no tool calls (the raw answer is in
    the transcript), so no caller can take a cut-off or refused answer for a complete one."""
    usage: TokenUsage
    """Every provider answer this call needed (a refused response_format or a cut-off first try included)."""
    latency_s: float
    transcript: ArtifactRef
    attempt: int = 1
    provider: str
    unusable: str = ""
    """Why the answer must not be used (cut off at max_tokens, refused, stopped by a content filter);
    empty for a complete answer. Callers turn it into a rejection (activities.llm.structured.usable_text)."""

    @property
    def usage_reported(self) -> bool:
        """False when the server did not say what this call cost (see TokenUsage.reported)."""
        return self.usage.reported
