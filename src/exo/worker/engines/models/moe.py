"""The mixture-of-experts feed-forward, shared by every MoE family.

    x      = rmsnorm(h) * g_ffn                                   [N, D]  (N tokens of the step)
    w, e   = route(x Wr^T (+ br))                                 k experts per token (`router.py`)
    y_n    = sum_{r < k} w[n, r] * expert_{e[n, r]}(x_n)          in rank order r = 0, 1, ...
             (+ shared(x_n))                                      shared experts (DeepSeek, GLM)
    expert(x) = act(x Wg^T + bg, x Wu^T + bu) Wd^T + bd           act: silu(g) u | gelu_tanh(g) u
                                                                  | gpt-oss's clamped SwiGLU
    h      = h + allreduce(y)

Each expert is two running linears (gate|up, down) over its own rows of the file's weights:
a merged 3-D GGUF tensor (`ffn_gate_exps` [E, F, D]) is read as one [E*F, D] matrix in the
file's quant and each expert is a view of its F rows (no float copy, no byte copy); per-expert
safetensors give one matrix per expert. A step groups its tokens by expert: each expert chosen
by any token runs once on the rows that chose it, an expert chosen by none is never read.
Every token's outputs are kept apart by routing rank and summed in rank order, so a request's
result does not depend on which other requests share its batch. Where every expert runs in the
compiled kernels (on the CPU, float32 activations), the whole feed-forward is one C call
(`moe_kernels.MoeFfn`: norm, router logits, routing, the chosen experts, gpt-oss's clamp, the
rank-ordered sum and the residual, each row by itself: no torch work and no Python per layer);
`route` / `routed` below are the torch path (other devices and formats, and the reference the
C call is tested against), whose chosen experts also run in one C call (`MoeExperts`: the same
kernel calls on the same rows, bit for bit) except gpt-oss's (its clamp runs in torch).

Tensor parallelism splits every expert like the dense MLP: rank r holds rows [r F/W, (r+1) F/W)
of each expert's gate and up and those columns of its down (the router is replicated; a down
bias is added by rank 0 only); the all-reduce sums the partial outputs.
"""

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from exo.worker.engines.config import ExpertActivation as ExpertActivation
from exo.worker.engines.cpu_kernels import QKernels, QuantWeights
from exo.worker.engines.linear import GeGLU, Linear, QuantLinear, SwiGLU
from exo.worker.engines.materialise import StoredTensor, TensorSource, materialise
from exo.worker.engines.models.base import AllReduce, no_all_reduce
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.norms import rms_norm
from exo.worker.engines.models.router import RouterSpec, route
from exo.worker.engines.moe_kernels import FfnRouting, MoeExperts, MoeFfn
from exo.worker.engines.qtensor import QuantTensor, Weight


@dataclass(frozen=True)
class ClampedSwiGLU:
    """gpt-oss: g = min(gate, limit); u = clamp(up, -limit, limit); (u + 1) * g * sigmoid(a g)."""

    alpha: float = 1.702
    limit: float = 7.0

    def __call__(self, gate: Tensor, up: Tensor) -> Tensor:
        g = gate.clamp(max=self.limit)
        u = up.clamp(min=-self.limit, max=self.limit)
        return (u + 1) * (g * torch.sigmoid(g * self.alpha))


@dataclass(frozen=True)
class ExpertWeights:
    """E experts' matrices, one `Weight` each (views of a merged tensor, or per-expert ones)."""

    gate: list[Weight]  # E x [F, D]
    up: list[Weight]  # E x [F, D]
    down: list[Weight]  # E x [D, F]
    gate_bias: Tensor | None = None  # [E, F]   (gpt-oss)
    up_bias: Tensor | None = None  # [E, F]
    down_bias: Tensor | None = None  # [E, D]

    def __post_init__(self) -> None:
        if not len(self.gate) == len(self.up) == len(self.down) > 0:
            raise ValueError("every expert needs a gate, an up and a down matrix")

    @property
    def n_experts(self) -> int:
        return len(self.gate)


@dataclass(frozen=True)
class SharedExpert:
    """Always-on experts (DeepSeek, GLM): one dense gated MLP of width S."""

    gate: Weight  # [S, D]
    up: Weight  # [S, D]
    down: Weight  # [D, S]


@dataclass(frozen=True)
class MoeWeights:
    """One MoE feed-forward's weights, as loaded (its pre-norm is the layer's `ffn_norm`)."""

    router: Tensor  # [E, D]
    experts: ExpertWeights
    router_bias: Tensor | None = None  # [E]  added to the logits (gpt-oss)
    correction_bias: Tensor | None = None  # [E]  added to the scores for choosing (DeepSeek V3)
    shared: SharedExpert | None = None


# --- loading -------------------------------------------------------------------------------------


def split_experts(w: Weight, n_experts: int) -> list[Weight]:
    """A merged [E * R, C] matrix -> E matrices [R, C]: row views, in the file's format."""
    rows = w.shape[0] // n_experts
    if rows * n_experts != w.shape[0]:
        raise ValueError(f"{w.shape[0]} rows do not split into {n_experts} experts")
    if isinstance(w, QuantTensor):
        return [w.rows(e * rows, (e + 1) * rows) for e in range(n_experts)]
    return [w[e * rows : (e + 1) * rows] for e in range(n_experts)]


def stacked_experts(src: TensorSource, name: str, n_experts: int) -> list[Weight]:
    """A merged 3-D tensor [E, R, C] (llama.cpp's `ffn_*_exps`) as E matrices [R, C], held as
    the source's plan holds a matrix (the file's blocks, q8 blocks or plain tensors)."""
    st = src.stored(name)
    if len(st.shape) != 3 or st.shape[0] != n_experts:
        raise ValueError(f"{name}: shape {st.shape} is not [{n_experts} experts, rows, cols]")
    flat = StoredTensor(st.reader, st.name, st.kind, (st.shape[0] * st.shape[1], st.shape[2]))
    return split_experts(materialise(flat, src.plan), n_experts)


# --- tensor parallel -----------------------------------------------------------------------------


def rows_of(w: Weight, rank: int, world: int) -> Weight:
    """Rank `rank` of `world`'s share of a matrix's rows (column-parallel)."""
    n = w.shape[0] // world
    if isinstance(w, QuantTensor):
        return w.rows(rank * n, (rank + 1) * n)
    return w[rank * n : (rank + 1) * n].contiguous()


def cols_of(w: Weight, rank: int, world: int) -> Weight:
    """Rank `rank` of `world`'s share of a matrix's columns (row-parallel; blocks a boundary
    would split are dequantised first)."""
    n = w.shape[1] // world
    if isinstance(w, QuantTensor):
        sliced = w.cols(rank * n, (rank + 1) * n)
        return sliced if sliced is not None else w.dequantize()[:, rank * n : (rank + 1) * n]
    return w[:, rank * n : (rank + 1) * n].contiguous()


def bias_rows(b: Tensor | None, rank: int, world: int) -> Tensor | None:
    """Rank `rank` of `world`'s share of a bias's last axis (per expert for [E, F] ones)."""
    if b is None:
        return None
    n = b.shape[-1] // world
    return b[..., rank * n : (rank + 1) * n].contiguous()


def slice_moe(w: MoeWeights, rank: int, world: int) -> MoeWeights:
    """The share of an MoE feed-forward that tensor-parallel rank `rank` of `world` computes."""
    f = w.experts.gate[0].shape[0]
    shared_f = 0 if w.shared is None else w.shared.gate.shape[0]
    if f % world or shared_f % world:
        raise ValueError(
            f"the expert width ({f}) and shared-expert width ({shared_f}) must divide by the "
            f"tensor-parallel world size ({world})"
        )
    x = w.experts
    experts = ExpertWeights(
        gate=[rows_of(g, rank, world) for g in x.gate],
        up=[rows_of(u, rank, world) for u in x.up],
        down=[cols_of(d, rank, world) for d in x.down],
        gate_bias=bias_rows(x.gate_bias, rank, world),
        up_bias=bias_rows(x.up_bias, rank, world),
        down_bias=x.down_bias if rank == 0 else None,
    )
    shared = None
    if w.shared is not None:
        s = w.shared
        shared = SharedExpert(
            rows_of(s.gate, rank, world), rows_of(s.up, rank, world), cols_of(s.down, rank, world)
        )
    return replace(w, experts=experts, shared=shared)


# --- running -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Expert:
    gate_up: Linear  # x [n, D] -> [gate | up] [n, 2F] (+ biases)
    down: Linear  # [n, 2F] -> act(gate, up) Wd^T (+ bias)   (silu / gelu: fused prologue)
    clamped: bool = False  # gpt-oss's clamped SwiGLU runs between them (not fused)


def _expert(make: LinearMaker, x: ExpertWeights, e: int, activation: ExpertActivation) -> _Expert:
    bias = None
    if x.gate_bias is not None and x.up_bias is not None:
        bias = torch.cat([x.gate_bias[e], x.up_bias[e]])
    prologue = {"silu": SwiGLU(), "gelu_tanh": GeGLU(), "swiglu_oai": None}[activation]
    down_bias = None if x.down_bias is None else x.down_bias[e]
    return _Expert(
        make([x.gate[e], x.up[e]], bias),
        make(x.down[e], down_bias, prologue),
        clamped=activation == "swiglu_oai",
    )


class MoeFeedForward:
    """h [B, T, D] -> h + allreduce(moe(rmsnorm(h) g)) (see the module docstring)."""

    def __init__(
        self,
        norm: Tensor,
        weights: MoeWeights,
        spec: RouterSpec,
        make: LinearMaker,
        *,
        activation: ExpertActivation = "silu",
        clamp: ClampedSwiGLU | None = None,
        all_reduce: AllReduce,
    ) -> None:
        if weights.experts.n_experts != spec.n_experts or weights.router.shape[0] != spec.n_experts:
            raise ValueError(f"MoE weights do not hold the router's {spec.n_experts} experts")
        dev = make.device
        self.spec = spec
        self.eps = make.eps
        self.norm = norm.to(device=dev, dtype=make.dtype)
        self.router = weights.router.to(device=dev, dtype=torch.float32)
        self.router_bias = _opt(weights.router_bias, dev)
        self.correction_bias = _opt(weights.correction_bias, dev)
        self.activation: ExpertActivation = activation
        self.clamp = clamp or ClampedSwiGLU()
        self.experts = [
            _expert(make, weights.experts, e, activation) for e in range(spec.n_experts)
        ]
        # the chosen experts in one C call where every expert runs in the kernels (else: a loop)
        self.native: MoeExperts | None = _native_experts(self.experts)
        self.shared: _Expert | None = None
        if weights.shared is not None:
            s = weights.shared
            self.shared = _Expert(make([s.gate, s.up]), make(s.down, None, SwiGLU()))
        self.all_reduce = all_reduce
        # the whole feed-forward in one C call where it all runs in the kernels (`moe_kernels.py`)
        self.fused: MoeFfn | None = _fused(self, on_cpu=dev.type == "cpu")

    def __call__(self, h: Tensor) -> Tensor:
        if self.fused is not None and h.dtype == torch.float32 and h.is_cpu:
            flat = h.reshape(-1, h.shape[-1])
            if self.all_reduce is no_all_reduce:
                return self.fused(flat).out.reshape(h.shape)
            return h + self.all_reduce(self.fused(flat, residual=False).out.reshape(h.shape))
        x = rms_norm(h, self.norm, self.eps).reshape(-1, h.shape[-1])  # [N, D]
        y = self.routed(x)
        if self.shared is not None:
            y = y + self._run(self.shared, x)
        return h + self.all_reduce(y.reshape(h.shape).to(h.dtype))

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, D] (normed) -> (weights [N, k], experts [N, k])."""
        # one matrix-vector product per token: a matrix product's result for a row may depend
        # on how many rows it has (BLAS picks its blocking by shape), a token's routing may not
        logits = torch.stack([torch.mv(self.router, row) for row in x.float()])
        if self.router_bias is not None:
            logits = logits + self.router_bias
        return route(logits, self.spec, self.correction_bias)

    def routed(self, x: Tensor) -> Tensor:
        """x [N, D] -> sum_r w[n, r] expert_{e[n, r]}(x_n): each chosen expert runs once, on
        the rows that chose it."""
        weights, experts = self.route(x)
        n, k = experts.shape
        outs = self.expert_outputs(x, experts)
        weighted = outs.view(n, k, -1) * weights.unsqueeze(-1)
        y = weighted[:, 0]
        for r in range(1, k):  # rank order, whatever the batch
            y = y + weighted[:, r]
        return y

    def expert_outputs(self, x: Tensor, experts: Tensor) -> Tensor:
        """x [N, D], experts [N, k] -> [N k, D]: row n k + r = expert_{experts[n, r]}(x_n)."""
        n, k = experts.shape
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)  # flat (token * k + rank) indices by expert
        counts = torch.bincount(flat, minlength=self.spec.n_experts)
        if self.native is not None and x.dtype == torch.float32 and x.is_cpu:
            chosen = counts.nonzero().flatten()  # an expert chosen by no token is not read
            return self.native(x, chosen.int(), counts[chosen].int(), order.int(), k)
        outs = x.new_zeros(n * k, x.shape[-1], dtype=torch.float32)  # by (token, rank)
        start = 0
        for e, count in enumerate(counts.tolist()):
            if count == 0:
                continue  # chosen by no token: its weights are not read
            picks = order[start : start + count]
            start += count
            outs[picks] = self._run(self.experts[e], x[picks // k]).float()
        return outs

    def _run(self, expert: _Expert, x: Tensor) -> Tensor:
        gate_up = expert.gate_up(x)
        if expert.clamped:
            half = gate_up.shape[-1] // 2
            gate_up = self.clamp(gate_up[..., :half], gate_up[..., half:])
        return expert.down(gate_up)

    def kernels(self) -> list[tuple[str, Linear]]:
        named = [(n, lin) for x in self.experts for n, lin in (("expert gate_up", x.gate_up),
                                                              ("expert down", x.down))]  # fmt: skip
        if self.shared is not None:
            named += [("shared gate_up", self.shared.gate_up), ("shared down", self.shared.down)]
        return named


def _native_experts(experts: list[_Expert]) -> MoeExperts | None:
    """One C call for the chosen experts (`moe_kernels.py`) when every expert's two layers run
    in the same compiled kernels and no step runs between them in torch (gpt-oss's clamp)."""
    layers = [(x.gate_up, x.down) for x in experts if not x.clamped]
    quant = [(g, d) for g, d in layers if isinstance(g, QuantLinear) and isinstance(d, QuantLinear)]
    if len(quant) != len(experts):
        return None
    gate_up, down = [g.native for g, _ in quant], [d.native for _, d in quant]
    kernels = gate_up[0][0]
    if any(k is not kernels for k, _ in gate_up + down):
        return None
    return MoeExperts(kernels, [w for _, w in gate_up], [w for _, w in down])


def _quant_pair(x: _Expert | None) -> tuple[QKernels, QuantWeights, QuantWeights] | None:
    """An expert's two layers as (kernels, gate|up, down) when both run in compiled kernels."""
    if x is None or not isinstance(x.gate_up, QuantLinear) or not isinstance(x.down, QuantLinear):
        return None
    (kg, g), (kd, d) = x.gate_up.native, x.down.native
    return (kg, g, d) if kg is kd else None


def _fused(ffn: MoeFeedForward, on_cpu: bool) -> MoeFfn | None:
    """The feed-forward in one C call (`MoeFfn`) when every expert (and the shared one) runs in
    the same compiled kernels on the CPU; None otherwise (the torch path runs it)."""
    pairs = [_quant_pair(x) for x in ffn.experts]
    shared = _quant_pair(ffn.shared)
    quant = [p for p in pairs if p is not None]
    if not on_cpu or len(quant) != len(pairs) or (ffn.shared is not None and shared is None):
        return None
    kernels = quant[0][0]
    if any(k is not kernels for k, _, _ in quant) or (shared and shared[0] is not kernels):
        return None
    clamped = ffn.activation == "swiglu_oai"
    experts = MoeExperts(kernels, [g for _, g, _ in quant], [d for _, _, d in quant], clamped)
    s = ffn.spec
    routing = FfnRouting(
        s.kind, s.top_k, s.normalize, s.n_group, s.topk_group, s.scaling, ffn.norm, ffn.eps,
        ffn.router, ffn.router_bias, ffn.correction_bias,
        (ffn.clamp.alpha, ffn.clamp.limit) if clamped else None,
    )  # fmt: skip
    return MoeFfn(experts, routing, None if shared is None else (shared[1], shared[2]))


def _opt(t: Tensor | None, device: torch.device) -> Tensor | None:
    return None if t is None else t.to(device=device, dtype=torch.float32)
