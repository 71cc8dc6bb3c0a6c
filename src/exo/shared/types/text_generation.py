"""The parameters of one text generation request, independent of API format."""

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import FrozenModel

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(FrozenModel):
    """A function call the model made: ``arguments`` is a JSON object's text."""

    id: str
    name: str
    arguments: str = "{}"


class ToolSpec(FrozenModel):
    """A function the model may call: ``parameters`` is a JSON schema's text."""

    name: str = Field(min_length=1)
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'


# auto: the model decides; none: no call; required: some call; a name: that function.
ToolChoice = Literal["auto", "none", "required"]


ImageFormat = Literal["PNG", "JPEG", "WEBP", "GIF"]


class InputImage(FrozenModel):
    """An image a message carries, checked by the API (it decodes, within the size limits):
    the file as the client sent it (its first frame is the picture, as RGB), its format and
    size in pixels, and the SHA-256 of its RGB pixels (what caches key on: the same picture
    in another format hashes the same)."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    data: bytes = Field(min_length=1)
    format: ImageFormat
    width: int = Field(ge=1)
    height: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class InputMessage(FrozenModel):
    role: Role
    content: str
    # The message's images, in the order the client sent them (after its text).
    images: list[InputImage] = []
    # An assistant turn's calls.
    tool_calls: list[ToolCall] = []
    # A tool result: the call it answers and the function's name.
    tool_call_id: str | None = None
    name: str | None = None


class TextGenerationTaskParams(FrozenModel):
    model: ModelId
    input: list[InputMessage] = Field(min_length=1)
    stream: bool = False
    # 0: generate nothing (with echo and logprobs: score the prompt only).
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] = []
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    # A raw prompt bypasses the chat template (Ollama /api/generate with raw=true).
    raw_prompt: str | None = None
    # The context for this request (Ollama num_ctx), at most the runner's own.
    num_ctx: int | None = Field(default=None, ge=1)
    # Count the prompt's tokens and generate nothing (Claude count_tokens).
    count_only: bool = False
    # Answer the raw prompt's embedding (one vector, on the final chunk) instead of text.
    embed: bool = False
    # An embedding's input longer than the context is cut to fit (Ollama) instead of refused.
    truncate: bool = False
    # Send the prompt's and the answer's token ids with the final chunk (Ollama context).
    return_context: bool = False
    # Token ids the prompt continues from (an earlier answer's Ollama context): they come
    # before the rendered prompt's own tokens.
    context_tokens: list[Annotated[int, Field(ge=0)]] = []
    # Functions the model may call, and whether it must.
    tools: list[ToolSpec] = []
    tool_choice: ToolChoice = "auto"
    # With tool_choice "required": this function (a named tool_choice).
    forced_tool: str | None = None
    # Log-probabilities of the output tokens, with this many alternatives each.
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    # Structured output: the answer is JSON following this schema (its JSON text).
    json_schema: str | None = None
    # The prompt as token ids (OpenAI completions' token-array prompt): used as they are,
    # no template and no BOS added. Overrides raw_prompt and input.
    prompt_ids: list[Annotated[int, Field(ge=0)]] | None = None
    # The final chunk carries the prompt's text and tokens (OpenAI completions' echo) and,
    # with logprobs, the log-probability of each prompt token after the first.
    echo: bool = False
    # OpenAI's logit_bias: token id -> bias added to its logit before sampling.
    logit_bias: dict[int, Annotated[float, Field(ge=-100.0, le=100.0)]] = {}
    # llama-server's extension (OpenAI chat and completions): end-of-sequence tokens are never
    # sampled, so the answer runs to max_tokens (or a stop sequence).
    ignore_eos: bool = False
    # The conversation ends in an assistant message that the answer continues (a prefill,
    # as Claude and Ollama do) instead of opening a new turn.
    continue_final_message: bool = False
    # Extra variables for the chat template (enable_thinking, reasoning_effort...).
    template_kwargs: dict[str, str | bool] = {}
