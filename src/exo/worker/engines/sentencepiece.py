"""SentencePiece vocabularies of GGUF files (`tokenizer.ggml.model == "llama"`) as a `tokenizers` BPE.

Llama 2, Mistral and Gemma GGUFs store a SentencePiece BPE vocabulary: pieces, one score each,
and a type (normal, unknown, control, user-defined, unused, byte). Spaces are spelled "▁". The
encoder starts from single characters and repeatedly joins the adjacent pair whose join is the
best-ranked piece; characters outside the vocabulary fall back to their UTF-8 bytes (<0x41>).

That is byte-level-free BPE with byte fallback, where the merges are every split (left, right)
of every piece into two pieces, ranked by the rank of the joined piece. The rank is the score
(Llama, Mistral) or, for Gemma, the order of the pieces in the file: Gemma's scores do not
follow its merge order. Gemma also stores whitespace-only pieces with real spaces; they are
respelled with "▁" like every other space.

Text normalisation: a leading "▁" when the file asks for a space prefix (Llama's default; not
doubled when the text starts with a space, except for Phi-3, following transformers), and every
space replaced by "▁". Decoding undoes both and joins byte pieces back into characters.
"""

from collections.abc import Mapping
from typing import cast

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPACE = "\u2581"  # ▁
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(
    1, 7
)


def _pieces(meta: Mapping[str, object], gemma: bool) -> list[str]:
    tokens = cast(list[str], meta["tokenizer.ggml.tokens"])
    if not gemma:
        return tokens
    return [SPACE * len(t) if t and " " in t and not t.strip() else t for t in tokens]


def derive_merges(pieces: list[str], ranks: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a piece into two pieces, best-ranked joined piece first.

    `ranks[i]` is the priority of piece i (higher merges first). Among equal ranks: longer left,
    then longer right part first, then vocabulary order (a stable sort).
    """
    index = {p: i for i, p in enumerate(pieces)}
    found: list[tuple[float, int, int, str, str]] = []  # (-rank, -len left, -len right, l, r)
    for i, piece in enumerate(pieces):
        splits = [
            (index[piece[:k]], index[piece[k:]])
            for k in range(1, len(piece))
            if piece[:k] in index and piece[k:] in index
        ]
        for left_id, right_id in sorted(splits):
            left, right = pieces[left_id], pieces[right_id]
            found.append((-ranks[i], -len(left), -len(right), left, right))
    found.sort(key=lambda m: (m[0], m[1], m[2]))  # stable: vocabulary order among ties
    return [(m[3], m[4]) for m in found]


def build_sentencepiece_bpe(meta: Mapping[str, object], architecture: str) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to a GGUF SentencePiece vocabulary."""
    gemma = architecture.startswith("gemma")
    pieces = _pieces(meta, gemma)
    n = len(pieces)
    types = cast(list[int], meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * n)
    if gemma:
        ranks = [float(-i) for i in range(n)]
    else:
        ranks = [
            float(s) for s in cast(list[float], meta.get("tokenizer.ggml.scores") or [0.0] * n)
        ]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    if not isinstance(unk_id, int):
        unk_id = types.index(TOKEN_UNKNOWN) if TOKEN_UNKNOWN in types else None
    vocab = {p: i for i, p in enumerate(pieces)}
    bpe = models.BPE(
        vocab=vocab,
        merges=derive_merges(pieces, ranks),
        unk_token=None if unk_id is None else pieces[unk_id],
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    steps: list[decoders.Decoder] = [
        decoders.Replace(SPACE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if meta.get("tokenizer.ggml.add_space_prefix", True) is not True:
        tok.normalizer = normalizers.Replace(" ", SPACE)
    elif architecture == "phi3":  # "▁" before the text even when it starts with a space
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)]
        )
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        # "▁" before the text unless it starts with one (not before each piece between special
        # tokens); spaces as "▁"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first", split=False
        )
        steps.append(decoders.Strip(content=" ", left=1, right=0))
        tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence(steps)
    control = [pieces[i] for i, t in enumerate(types) if t == TOKEN_CONTROL]
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in control])
    user = [pieces[i] for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
    tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in user])
    return tok
