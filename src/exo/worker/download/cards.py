"""Model cards built from the hub on demand, without downloading weights.

``org/repo`` (safetensors): the file list with sizes and sha256 from the hub's model
info, the shape from ``config.json``. ``org/repo:QUANT`` (or a repo holding GGUF files):
the chosen quant's files, the shape from the GGUF header, read with a Range request on
the head of the file. The card pins the commit it was built from.
"""

import json
import re
from typing import Any, cast

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session

from exo.shared.models.hub_files import (
    choose_gguf,
    choose_mmproj,
    gguf_files,
    quant_of,
    split_parts_complete,
)
from exo.shared.models.memory import mla_kv_bytes_per_token
from exo.shared.models.model_cards import (
    HubFile,
    HubSource,
    ModelCard,
    ModelId,
    config_takes_images,
    is_mmproj,
)
from exo.shared.models.qwen_vision_memory import QwenTowerShape, qwen_vision_fields
from exo.shared.models.vision_memory import VisionFields, card_vision_fields
from exo.shared.types.memory import Memory
from exo.worker.download.gguf_head import TruncatedHead, read_gguf_metadata
from exo.worker.download.gguf_index import read_gguf_index
from exo.worker.download.hub import DownloadError, HubSettings, _fetch, explain
from exo.worker.download.hub_names import hub_source_problem, repo_id_problem
from exo.worker.download.shard_gguf import keep_head
from exo.worker.download.vision_card import config_vision_fields, hub_gguf_vision_fields
from exo.worker.engines.config import check_context_length

_QUANT = re.compile(r"^[\w.-]{1,64}$")
UNSAFE_HUB_ANSWER = 502
"""The status of a hub answer whose names would lead out of the cache."""
_HEAD_START = 1 << 20
_HEAD_MAX = 64 << 20
# config.json's torch_dtype -> the safetensors dtype of the weights.
_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def parse_model_name(name: str) -> tuple[str, str | None] | None:
    """``org/repo`` or ``org/repo:QUANT`` -> (repo, quant); None when it is neither."""
    repo, _, quant = name.strip().partition(":")
    if repo_id_problem(repo) is not None or (quant and not _QUANT.match(quant)):
        return None
    return repo, quant or None


def hub_name_problem(name: str) -> str | None:
    """Why a name written like a hub model (it has a ``/``) is not one, or None (a valid
    hub name, or a name that does not look like one at all)."""
    repo, _, quant = name.strip().partition(":")
    if "/" not in repo:
        return None
    problem = repo_id_problem(repo)
    if problem is None and quant and not _QUANT.match(quant):
        problem = f"{quant!r} is not a quant name (letters, digits, '_', '-', '.')"
    return problem


def card_from_hub(name: str, settings: HubSettings) -> ModelCard:
    """Build a card from the hub's metadata. Raises DownloadError (404/403 or transient)."""
    parsed = parse_model_name(name)
    if parsed is None:
        raise DownloadError(f"{name!r} is not a hub model name (org/repo or org/repo:QUANT)", 400)
    repo_id, quant = parsed
    if settings.offline:
        raise DownloadError(f"cannot build a card for {repo_id}: HF_HUB_OFFLINE=1", 404)
    try:
        api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
        info = api.model_info(repo_id, files_metadata=True)
        if info.sha is None or info.siblings is None:
            raise DownloadError(f"the hub gave no file list for {repo_id}")
        files = [
            HubFile(path=s.rfilename, size=int(s.size or 0),
                    sha256=s.lfs.sha256 if s.lfs is not None else None)
            for s in info.siblings
        ]
        hub = HubSource(repo_id=repo_id, revision=info.sha, files=files)
        problem = hub_source_problem(hub)
        if problem is not None:
            raise DownloadError(f"the hub's answer for {repo_id} is refused: {problem}",
                                UNSAFE_HUB_ANSWER)
        if quant is not None or (gguf_files(files) and not _has_safetensors(files)):
            return _gguf_card(name, hub, quant, settings)
        return _safetensors_card(name, hub, settings)
    except DownloadError:
        raise
    except Exception as e:
        raise explain(e, repo_id, settings) from e


def _has_safetensors(files: list[HubFile]) -> bool:
    return any(f.path.endswith(".safetensors") for f in files)


def _safetensors_card(name: str, hub: HubSource, settings: HubSettings) -> ModelCard:
    weights = [f for f in hub.files if f.path.endswith(".safetensors") and "/" not in f.path]
    if not weights or not any(f.path == "config.json" for f in hub.files):
        raise DownloadError(f"{hub.repo_id} has no safetensors weights with a config.json", 404)
    raw: dict[str, Any] = json.loads(_fetch(hub, "config.json", settings).read_text())
    vision = config_takes_images(raw)
    vision_fields = config_vision_fields(raw, _hub_preprocessor(hub, settings) if vision else None)
    raw = raw.get("text_config", raw) if "num_hidden_layers" not in raw else raw
    heads = int(raw["num_attention_heads"])
    weight_format = _DTYPES.get(str(raw.get("torch_dtype") or raw.get("dtype")), "")
    embedding = _DTYPE_BYTES.get(weight_format, 0) * int(raw.get("vocab_size") or 0) * int(
        raw["hidden_size"]
    )
    return ModelCard(
        model_id=ModelId(name),
        n_layers=int(raw["num_hidden_layers"]),
        hidden_size=int(raw["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        storage_size=Memory(in_bytes=sum(f.size for f in weights)),
        context_length=_context(int(raw.get("max_position_embeddings", 4096)), hub.repo_id),
        architecture=str(raw.get("model_type", "unknown")),
        aliases=[name.lower()],
        hub=hub,
        chat_template=_hub_chat_template(hub, settings),
        head_dim=int(raw["head_dim"]) if raw.get("head_dim") else None,
        weight_format=weight_format,
        embedding_bytes=embedding,
        head_bytes=0 if raw.get("tie_word_embeddings", False) else embedding,
        n_experts=_expert_count(raw),
        experts_per_token=int(raw.get("num_experts_per_tok") or 0),
        kv_bytes_per_token=mla_kv_bytes_per_token(
            int(raw["num_hidden_layers"]), int(raw["kv_lora_rank"]), int(raw["qk_rope_head_dim"])
        )
        if raw.get("kv_lora_rank")
        else 0,
        vision=vision,
        **vision_fields,
    )


def _hub_preprocessor(hub: HubSource, settings: HubSettings) -> dict[str, Any] | None:
    """A vision repo's preprocessor_config.json (its processor's largest image), if listed."""
    if not any(f.path == "preprocessor_config.json" for f in hub.files):
        return None
    raw = json.loads(_fetch(hub, "preprocessor_config.json", settings).read_text())
    return cast(dict[str, Any], raw) if isinstance(raw, dict) else None


def _expert_count(raw: dict[str, Any]) -> int:
    """Routed experts of an MoE config.json (Qwen3-MoE, gpt-oss, DeepSeek); 0 for dense."""
    count = raw.get("num_experts") or raw.get("num_local_experts") or raw.get("n_routed_experts")
    return int(count or 0)


def _gguf_card(name: str, hub: HubSource, quant: str | None, settings: HubSettings) -> ModelCard:
    chosen = choose_gguf(hub.files, quant)
    if isinstance(chosen, str):
        raise DownloadError(f"{hub.repo_id}: {chosen}", 404)
    if not split_parts_complete(chosen):
        raise DownloadError(f"{hub.repo_id}: the split GGUF is missing parts", 404)
    meta = _gguf_metadata(hub, chosen[0].path, settings)
    arch = str(meta.get("general.architecture", "llama"))

    def key(suffix: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{suffix}", default)
        if value is None:
            raise DownloadError(f"{hub.repo_id}: the GGUF header has no {arch}.{suffix}", 404)
        return int(value)

    heads = key("attention.head_count")
    template = meta.get("tokenizer.chat_template")
    # GLM's files carry its multi-token-prediction block(s) as more blocks: not layers to run
    n_layers = key("block_count") - key("nextn_predict_layers", 0)
    kv_latent = 0
    if key("attention.kv_lora_rank", 0):  # MLA (deepseek2): the cache is one latent
        kv_latent = mla_kv_bytes_per_token(
            n_layers, key("attention.kv_lora_rank"), key("rope.dimension_count")
        )
    # a vision model's projector travels with the pinned files (the first stage fetches it)
    mmproj = choose_mmproj(hub.files)
    pinned = hub.model_copy(update={"files": [*chosen, *([mmproj] if mmproj else [])],
                                    "gguf_quant": quant or _quant_name(chosen)})  # fmt: skip
    return ModelCard(
        model_id=ModelId(name),
        n_layers=n_layers,
        hidden_size=key("embedding_length"),
        num_heads=heads,
        num_kv_heads=key("attention.head_count_kv", heads),
        storage_size=Memory(in_bytes=sum(f.size for f in chosen)),
        context_length=_context(key("context_length", 4096), hub.repo_id),
        architecture=arch,
        aliases=[name.lower()],
        hub=pinned,
        chat_template=template if isinstance(template, str) else None,
        head_dim=key("attention.key_length", key("embedding_length") // max(heads, 1)),
        weight_format=(pinned.gguf_quant or "").upper(),
        n_experts=key("expert_count", 0),
        experts_per_token=key("expert_used_count", 0),
        kv_bytes_per_token=kv_latent,
        vision=any(is_mmproj(f.path) for f in hub.files),
        **_gguf_vision_fields(hub, mmproj, arch, key("embedding_length"), settings),
    )


def _gguf_vision_fields(
    hub: HubSource, mmproj: HubFile | None, arch: str, hidden: int, settings: HubSettings
) -> VisionFields:
    """The tower's memory: a Qwen-VL repo's from its mmproj's header (read as the model's),
    Gemma 3's from its one tower shape."""
    if mmproj is None or arch not in ("qwen2vl", "qwen3vl"):
        return hub_gguf_vision_fields(hub.files, arch, hidden)
    meta, head = _gguf_head(hub, mmproj.path, settings)
    try:
        table = {t.name: t.dims for t in read_gguf_index(head).tensors}
    except (TruncatedHead, ValueError):  # a table past the bytes read: no position table
        table = {}
    positions = table.get("v.position_embd.weight", (0, 0))
    shape = QwenTowerShape.from_mmproj(meta, positions[-1] if len(positions) > 1 else 0)
    return card_vision_fields(None) if shape is None else qwen_vision_fields(shape)


def _context(context_length: int, repo_id: str) -> int:
    """A declared context a card may carry (at most 2^24 positions), else a clear refusal."""
    try:
        check_context_length(context_length)
    except ValueError as e:
        raise DownloadError(f"{repo_id}: {e}", 400) from e
    return context_length


def _hub_chat_template(hub: HubSource, settings: HubSettings) -> str | None:
    """A safetensors repo's chat template: chat_template.jinja, else tokenizer_config.json's."""
    names = {f.path for f in hub.files}
    if "chat_template.jinja" in names:
        return _fetch(hub, "chat_template.jinja", settings).read_text(encoding="utf-8")
    if "tokenizer_config.json" not in names:
        return None
    config: dict[str, Any] = json.loads(_fetch(hub, "tokenizer_config.json", settings).read_text())
    template = config.get("chat_template")
    return template if isinstance(template, str) else None


def _quant_name(files: list[HubFile]) -> str:
    return quant_of(files[0].path) or "unknown"


def _gguf_metadata(hub: HubSource, path: str, settings: HubSettings) -> dict[str, Any]:
    return _gguf_head(hub, path, settings)[0]


def _gguf_head(hub: HubSource, path: str, settings: HubSettings) -> tuple[dict[str, Any], bytes]:
    """Read the header with growing Range requests (1 MB, then doubling up to 64 MB), each
    continuing where the last ended; what was read is kept for a shard download to reuse:
    (its metadata, the bytes read)."""
    url = hf_hub_url(hub.repo_id, path, revision=hub.revision, endpoint=settings.endpoint)
    headers = build_hf_headers(token=settings.token or False)
    data = b""
    client = get_session()
    while True:
        size = max(_HEAD_START, 2 * len(data))
        r = client.get(url, headers={**headers, "Range": f"bytes={len(data)}-{size - 1}"},
                       follow_redirects=True, timeout=30)
        if r.status_code in (401, 403):
            raise DownloadError(f"{hub.repo_id}: access denied by the hub ({r.status_code})", 403)
        if r.status_code == 404:
            raise DownloadError(f"{hub.repo_id}: {path} not found on the hub", 404)
        r.raise_for_status()
        data = r.content if r.status_code == 200 else data + r.content  # 200: Range ignored
        try:
            meta = read_gguf_metadata(data)
        except TruncatedHead:
            if size >= _HEAD_MAX or len(data) < size:
                raise DownloadError(f"{hub.repo_id}: {path} has no complete GGUF header") from None
            continue
        except ValueError as e:
            raise DownloadError(f"{hub.repo_id}: {path}: {e}", 404) from e
        keep_head(settings.cache_dir, hub, path, data[:size])
        return meta, data[:size]
