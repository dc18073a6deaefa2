"""What moe-stack knows of a model once its files are read (ModelFacts): its architecture, its layers'
weights (routed experts apart), what its KV cache and recurrent state hold per token, and what a decoded
token reads. Read from a GGUF by models/gguf_facts.py, from kt-kernel's converted weights by
models/kt_weights.py; planned against VRAM by models/planner.py."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs from a GGUF."""

    arch: str
    layers: int
    expert_bytes: tuple[int, ...]  # routed-expert bytes per layer
    other_bytes: int  # everything else (attention, norms, shared experts, embeddings, output)
    kv_heads: int
    key_dim: int
    value_dim: int
    mla_dim: int | None = None  # deepseek2: kv_lora_rank + rope dims per token and layer, cached with MLA
    expert_count: int = 0  # routed experts per layer (0: not an MoE model)
    experts_used: int = 0  # routed experts each token runs through, per layer
    # The groups a token's experts are chosen within ({arch}.expert_group_count; 0 or 1: none): mainline
    # applies them itself, ik_llama.cpp to Ling's bailingmoe2 on its -ger switch only.
    expert_groups: int = 0
    attention_layers: int | None = None  # layers with a KV cache (qwen3next: one in four); None: all
    recurrent_state_bytes: int = 0  # the recurrent layers' conv and SSM state, f32, per sequence
    heads: int = 0  # query heads
    embedding_bytes: int = 0  # token_embd: both engines keep it in RAM (only one row a token is read)
    vocab: int = 0  # tokens of the vocabulary (token_embd's rows): the logits a token outputs
    hidden: int = 0  # the embedding length
    expert_ffn: int = 0  # a routed expert's feed-forward width ({arch}.expert_feed_forward_length)
    # Multi-token-prediction layers (DeepSeek's, GLM's and Qwen3-Next's NextN): the last `nextn_layers` of
    # `layers`, whose weights mainline loads only for MTP drafting (`without_nextn`, the adapter's
    # `loaded_facts`) and ik_llama.cpp never (moe-stack drafts with none on it); both skip their KV cache
    # unless MTP drafting is on (ik_llama.cpp's n_layer_kv_from_start; served GLM-4.x-shaped files logged 3
    # of 4 layers' cache on both engines, tests/integration/test_families.py).
    nextn_layers: int = 0
    nextn_other_bytes: int = 0  # those layers' weights but their routed experts (attention, shared expert)
    # Tokens of its sliding-window layers' attention (Gemma 3, gpt-oss; 0: none): mainline's cache keeps
    # only the window there, and a saved slot with it (it restores such a slot only with --swa-full).
    sliding_window: int = 0
    window_layers: int = 0  # of the cached layers, those that attend over the window only
    context_length: int = 0  # the context it was trained for ({arch}.context_length; 0: not said)
    # DeepSeek Sparse Attention's indexer (GLM-5's glm-dsa): the key width a token caches per layer beside
    # the latent ({arch}.attention.indexer.key_length; 0: none), where the engine builds it (CacheLayout).
    indexer_dim: int = 0
    # Layers with an indexer (its key projection): MiniMax-M3's sparse layers, whose keys (and a value of the
    # head's width) mainline caches beside a non-latent cache (llama_kv_cache_msa).
    indexer_layers: int = 0
    # DeepSeek-V4's compressed attention: per layer, the tokens one compressed row of its cache stands for
    # (4: read sparsely, the indexer's keys beside it; 128: read densely; 0: the raw window alone).
    compress_ratios: tuple[int, ...] = ()
    # The MLA up-projection's form the file lacks, as ik_llama.cpp builds it at load (`built_mla_bytes`).
    built_mla_bytes: int = 0

    @property
    def gpu_weight_bytes(self) -> int:
        """The non-expert weights a GPU stack holds in VRAM: all but the token embeddings (both engines
        keep those in RAM: the logs' CUDA0 model buffer is the rest, to the MiB)."""
        return self.other_bytes - self.embedding_bytes

    def without_nextn(self) -> ModelFacts:
        """The model as an engine that skips its NextN layers loads it (mainline without --mtp)."""
        if not self.nextn_layers:
            return self
        kept = self.layers - self.nextn_layers
        attention = None if self.attention_layers is None else self.attention_layers - self.nextn_layers
        return replace(
            self,
            layers=kept,
            expert_bytes=self.expert_bytes[:kept],
            other_bytes=self.other_bytes - self.nextn_other_bytes,
            attention_layers=attention,
            nextn_layers=0,
            nextn_other_bytes=0,
        )

    @property
    def expert_layers(self) -> int:
        """Layers that hold routed experts (DeepSeek's first three are dense)."""
        return sum(1 for layer_bytes in self.expert_bytes if layer_bytes)

    @property
    def cached_layers(self) -> int:
        cached = self.layers if self.attention_layers is None else self.attention_layers
        return cached - self.nextn_layers

    @property
    def total_bytes(self) -> int:
        return sum(self.expert_bytes) + self.other_bytes

    def read_per_token(self, experts_only: bool) -> int:
        """Weight bytes one decoded token reads: the routed experts it runs through (`experts_only`: a
        hybrid stack, the rest on the GPU), else those and every other weight (a dense model: all)."""
        experts = sum(self.expert_bytes)
        active = experts * self.experts_used // self.expert_count if self.expert_count else experts
        return active if experts_only and self.expert_count else active + self.other_bytes
