"""A request's task parameters as the engine's sampling parameters."""

from exo.shared.types.text_generation import TextGenerationTaskParams
from exo.worker.engines.grammar import GrammarConstraint
from exo.worker.engines.sampling import SamplingParams, TokenLogprobs


def sampling_params(
    params: TextGenerationTaskParams,
    max_tokens: int,
    constraint: GrammarConstraint | None,
    sink: list[TokenLogprobs] | None,
    prompt_sink: list[TokenLogprobs] | None,
) -> SamplingParams:
    """The engine's sampling parameters for a request's task parameters."""
    return SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed,
        max_tokens=max_tokens,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        constraint=constraint,
        top_logprobs=params.top_logprobs,
        logprob_sink=sink,
        prompt_logprob_sink=prompt_sink,
        logit_bias=tuple(params.logit_bias.items()),
        ignore_eos=params.ignore_eos,
    )
