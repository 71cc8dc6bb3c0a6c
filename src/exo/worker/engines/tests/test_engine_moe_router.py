"""The MoE router and feed-forward: routing kinds against their written definitions, edge cases
(ties, one expert for every token, unchosen experts, batches of 1 and 64), batched == alone."""

import pytest
import torch
from torch import Tensor

from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.models.base import no_all_reduce
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.moe import (
    ClampedSwiGLU,
    ExpertActivation,
    ExpertWeights,
    MoeFeedForward,
    MoeWeights,
    SharedExpert,
    slice_moe,
    split_experts,
)
from exo.worker.engines.models.router import RouterSpec, route
from exo.worker.engines.qtensor import Q8_0, QuantTensor

from .kernel_skip import skip_without_kernels

E, D, F = 8, 64, 32


def test_softmax_top_k_with_and_without_renormalisation() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    probs = torch.softmax(logits, -1)[0]
    w, e = route(logits, RouterSpec("softmax", 4, 2))
    assert e.tolist() == [[1, 2]]
    assert torch.equal(w[0], probs[[1, 2]])
    w, _ = route(logits, RouterSpec("softmax", 4, 2, normalize=True))
    assert torch.allclose(w[0], probs[[1, 2]] / probs[[1, 2]].sum())


def test_gpt_oss_softmax_over_the_chosen_logits() -> None:
    w, e = route(torch.tensor([[0.5, 3.0, 2.0, 2.5]]), RouterSpec("softmax_selected", 4, 2))
    assert e.tolist() == [[1, 3]]
    assert torch.allclose(w[0], torch.softmax(torch.tensor([3.0, 2.5]), -1))


def test_sigmoid_group_limited_with_correction_bias_and_scaling() -> None:
    # 8 experts in 4 groups of 2; the bias moves expert 6 into the top; only 2 groups allowed.
    logits = torch.tensor([[3.0, 2.9, -1.0, -1.0, 0.0, 0.0, 0.0, -2.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0])
    spec = RouterSpec("sigmoid", 8, 3, normalize=True, n_group=4, topk_group=2, scaling=2.5)
    w, e = route(logits, spec, bias)
    # group scores (sum of the two best s + b): g0 = 1.9, g1 = 0.54, g2 = 2.38, g3 = 1.5
    assert sorted(e[0].tolist()) == [0, 1, 6]
    s = torch.sigmoid(logits[0])
    expected = s[e[0]] / s[e[0]].sum() * 2.5
    assert torch.allclose(w[0], expected)


def test_softmax_group_limited_scores_a_group_by_its_best_expert() -> None:
    # DeepSeek V2: 6 experts in 3 groups of 2, one group allowed. Group 1 holds the best
    # expert; group 2's pair has the larger sum (the V3 rule would pick it): V2 takes group 1.
    logits = torch.tensor([[0.0, -3.0, 2.0, -3.0, 1.6, 1.6]])
    spec = RouterSpec("softmax", 6, 2, n_group=3, topk_group=1, scaling=1.5)
    w, e = route(logits, spec)
    p = torch.softmax(logits[0], -1)
    assert e[0].tolist() == [2, 3]  # the allowed group's two experts, best first
    assert torch.allclose(w[0], p[[2, 3]] * 1.5)  # the softmax over all experts, not renormalised


def test_ties_go_to_the_lower_expert_whatever_the_batch() -> None:
    tied = torch.zeros(1, E)
    for kind in ("softmax", "softmax_selected", "sigmoid"):
        _, e = route(tied, RouterSpec(kind, E, 3))  # type: ignore[arg-type]
        assert e.tolist() == [[0, 1, 2]]
        batch = torch.cat([torch.randn(5, E), tied, torch.randn(3, E)])
        _, eb = route(batch, RouterSpec(kind, E, 3))  # type: ignore[arg-type]
        assert eb[5].tolist() == [0, 1, 2]


def test_bad_router_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="top_k"):
        RouterSpec("softmax", 4, 5)
    with pytest.raises(ValueError, match="groups"):
        RouterSpec("sigmoid", 8, 2, n_group=3)
    with pytest.raises(ValueError, match="experts"):
        route(torch.zeros(1, 3), RouterSpec("softmax", 4, 2))


def _weights(seed: int = 0, biases: bool = False, shared: bool = False) -> MoeWeights:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    experts = ExpertWeights(
        gate=split_experts(rand(E * F, D), E),
        up=split_experts(rand(E * F, D), E),
        down=[rand(D, F) for _ in range(E)],
        gate_bias=rand(E, F) if biases else None,
        up_bias=rand(E, F) if biases else None,
        down_bias=rand(E, D) if biases else None,
    )
    shared_expert = SharedExpert(rand(2 * F, D), rand(2 * F, D), rand(D, 2 * F)) if shared else None
    return MoeWeights(rand(E, D) * 5, experts, router_bias=rand(E) if biases else None,
                      shared=shared_expert)  # fmt: skip


def _ffn(
    w: MoeWeights,
    spec: RouterSpec,
    fmt: WeightFormat = "dense",
    activation: ExpertActivation = "silu",
) -> MoeFeedForward:
    kernels = load_kernels() if fmt != "dense" else None
    make = LinearMaker(fmt, torch.float32, torch.device("cpu"), kernels, 1e-5)
    norm = 1.0 + 0.1 * torch.randn(D, generator=torch.Generator().manual_seed(9))
    return MoeFeedForward(norm, w, spec, make, activation=activation, all_reduce=no_all_reduce)


def _reference(ffn: MoeFeedForward, w: MoeWeights, h: Tensor, activation: str) -> Tensor:
    """Token by token, every expert dense, straight from the equations."""
    x = torch.nn.functional.rms_norm(h, (D,), ffn.norm, 1e-5)
    out = []
    for row in x.reshape(-1, D):
        weights, experts = ffn.route(row[None])
        y = torch.zeros(D)
        for wt, e in zip(weights[0].tolist(), experts[0].tolist(), strict=True):
            xe = w.experts
            gate = row @ torch.as_tensor(xe.gate[e]).T
            up = row @ torch.as_tensor(xe.up[e]).T
            if xe.gate_bias is not None and xe.up_bias is not None:
                gate, up = gate + xe.gate_bias[e], up + xe.up_bias[e]
            act = ClampedSwiGLU()(gate, up) if activation == "swiglu_oai" else (
                torch.nn.functional.silu(gate) * up)  # fmt: skip
            o = act @ torch.as_tensor(xe.down[e]).T
            y = y + wt * (o if xe.down_bias is None else o + xe.down_bias[e])
        if w.shared is not None:
            s = w.shared
            sg, su = row @ torch.as_tensor(s.gate).T, row @ torch.as_tensor(s.up).T
            y = y + (torch.nn.functional.silu(sg) * su) @ torch.as_tensor(s.down).T
        out.append(y)
    return h + torch.stack(out).reshape(h.shape)


@pytest.mark.parametrize(
    ("activation", "biases", "shared"), [("silu", False, True), ("swiglu_oai", True, False)]
)
def test_feed_forward_matches_the_equations(activation: str, biases: bool, shared: bool) -> None:
    w = _weights(1, biases, shared)
    kind = "softmax_selected" if biases else "softmax"
    ffn = _ffn(w, RouterSpec(kind, E, 2, normalize=True), activation=activation)  # type: ignore[arg-type]
    h = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(ffn(h), _reference(ffn, w, h, activation), atol=1e-5)


def test_all_tokens_to_one_expert_and_unchosen_experts_are_not_run() -> None:
    w = _weights(2)
    router = torch.zeros(E, D)
    router[5] = 1.0  # expert 5 wins for every token with a positive feature sum
    w = MoeWeights(router, w.experts)
    ffn = _ffn(w, RouterSpec("softmax", E, 1))
    called: list[int] = []
    for e, x in enumerate(ffn.experts):
        inner = x.gate_up

        def spy(t: Tensor, residual: Tensor | None = None, e: int = e, inner=inner) -> Tensor:  # type: ignore[no-untyped-def]
            called.append(e)
            return inner(t, residual)

        object.__setattr__(x, "gate_up", spy)
    h = torch.rand(1, 7, D) + 0.1  # positive: every token routes to expert 5
    ffn(h)
    assert called == [5]  # once for the whole step, the 7 other experts never read


def test_a_token_gives_the_same_bits_alone_or_in_batches_of_64() -> None:
    # (bit for bit on the compiled kernels, whose rows are independent; float32 `F.linear`,
    # the "dense" reference format, may round a row differently with more rows beside it)
    fmt: WeightFormat = "q8"
    skip_without_kernels(fmt)
    w = _weights(4, biases=True, shared=True)
    ffn = _ffn(w, RouterSpec("softmax_selected", E, 3), fmt, "swiglu_oai")
    h = torch.randn(64, 1, D, generator=torch.Generator().manual_seed(5))
    batched = ffn(h)
    for i in (0, 17, 63):
        assert torch.equal(ffn(h[i : i + 1]), batched[i : i + 1])
    chunk = ffn(h[10:30].reshape(1, 20, D))  # a prefill chunk of 20 tokens
    assert torch.equal(chunk.reshape(20, 1, D), batched[10:30])


def test_tensor_parallel_halves_sum_to_the_whole() -> None:
    w = _weights(6, biases=True, shared=True)
    spec = RouterSpec("softmax", E, 2)
    h = torch.randn(3, 2, D, generator=torch.Generator().manual_seed(7))
    whole = _ffn(w, spec, activation="silu")
    parts = [_ffn(slice_moe(w, r, 2), spec) for r in range(2)]
    x = torch.nn.functional.rms_norm(h, (D,), whole.norm, 1e-5).reshape(-1, D)
    total = parts[0].routed(x) + parts[1].routed(x)
    assert torch.allclose(total, whole.routed(x), atol=1e-5)


def test_experts_of_a_merged_quantised_tensor_are_views_of_its_bytes() -> None:
    from exo.worker.engines.linear import quantize_q8

    merged = QuantTensor(Q8_0, quantize_q8(torch.randn(E * F, D)).reshape(E * F, -1), D)
    experts = split_experts(merged, E)
    assert all(isinstance(x, QuantTensor) for x in experts)
    first, last = experts[0], experts[-1]
    assert isinstance(first, QuantTensor) and isinstance(last, QuantTensor)
    assert first.raw.data_ptr() == merged.raw.data_ptr()
    assert last.raw.data_ptr() == merged.raw[(E - 1) * F].data_ptr()


def _oracle_routers() -> list[tuple[str, object, RouterSpec]]:
    """transformers' own routers with the spec that should route as each does."""
    import transformers
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    qwen = transformers.Qwen3MoeConfig(
        hidden_size=D, num_experts_per_tok=4, num_experts=16, norm_topk_prob=True
    )
    oss = transformers.GptOssConfig(hidden_size=D, num_experts_per_tok=4, num_local_experts=16)
    glm = transformers.Glm4MoeConfig(
        hidden_size=D, num_experts_per_tok=4, n_routed_experts=16, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True,
    )  # fmt: skip
    return [
        ("qwen3moe", Qwen3MoeTopKRouter(qwen), RouterSpec("softmax", 16, 4, normalize=True)),
        ("gpt-oss", GptOssTopKRouter(oss), RouterSpec("softmax_selected", 16, 4)),
        ("glm4moe", Glm4MoeTopkRouter(glm),
         RouterSpec("sigmoid", 16, 4, normalize=True, n_group=4, topk_group=2, scaling=2.5)),
    ]  # fmt: skip


def test_each_router_kind_routes_as_transformers_own_router() -> None:
    pytest.importorskip("transformers")
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, D, generator=gen)
    for name, router, spec in _oracle_routers():
        assert isinstance(router, torch.nn.Module)
        with torch.no_grad():
            for p_name, p in router.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if "weight" in p_name else 1))
            bias = getattr(router, "e_score_correction_bias", None)
            if isinstance(bias, Tensor):
                bias.copy_(torch.randn(bias.shape, generator=gen) * 0.1)
            _, ref_w, ref_e = router(x)
        logits = x @ router.get_parameter("weight").T
        if name == "gpt-oss":
            logits = logits + router.get_parameter("bias")
        w, e = route(logits, spec, bias if isinstance(bias, Tensor) else None)
        order = ref_e.sort(-1).indices  # transformers' order within a token may differ
        ours = e.sort(-1).indices
        assert torch.equal(e.gather(-1, ours), ref_e.gather(-1, order)), name
        assert torch.allclose(w.gather(-1, ours), ref_w.float().gather(-1, order), atol=1e-6)
