"""The models a scale checkpoint holds: Llama-shaped transformers, by their parameter shapes.

Only shapes matter to a checkpoint's layout, so a model is its list of parameters - named and
ordered as Meta's reference ``Transformer`` registers them (``tok_embeddings``, then per layer
``attention.{wq,wk,wv,wo}``, ``feed_forward.{w1,w2,w3}``, ``attention_norm``, ``ffn_norm``; then
``norm`` and an untied ``output``), all fp32 as FSDP2 keeps its sharded masters. The same list
builds a real ``nn.Module`` at small sizes (:mod:`devtools.scale.llama`) for the check against
torch's own save.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LlamaShape:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Rows of the k and v projections: grouped-query attention keeps fewer heads there."""
        return self.n_kv_heads * self.head_dim

    def parameters(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter, in registration order (the state dict's order)."""
        d, kv, f = self.dim, self.kv_dim, self.ffn_dim
        out: list[tuple[str, tuple[int, ...]]] = [("tok_embeddings.weight", (self.vocab_size, d))]
        for i in range(self.n_layers):
            p = f"layers.{i}"
            out += [
                (f"{p}.attention.wq.weight", (d, d)),
                (f"{p}.attention.wk.weight", (kv, d)),
                (f"{p}.attention.wv.weight", (kv, d)),
                (f"{p}.attention.wo.weight", (d, d)),
                (f"{p}.feed_forward.w1.weight", (f, d)),
                (f"{p}.feed_forward.w2.weight", (d, f)),
                (f"{p}.feed_forward.w3.weight", (f, d)),
                (f"{p}.attention_norm.weight", (d,)),
                (f"{p}.ffn_norm.weight", (d,)),
            ]
        out += [("norm.weight", (d,)), ("output.weight", (self.vocab_size, d))]
        return out

    @property
    def numel(self) -> int:
        total = 0
        for _, shape in self.parameters():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    def policy_config(self) -> dict[str, object]:
        """``config.json``: the fields every policy config starts with, then the model's sizes.

        No ckpt-train policy is a Llama: ``type`` says so honestly (``llama``), and the tools
        read a policy config without building it.
        """
        sizes = asdict(self)
        name = sizes.pop("name")
        return {"type": "llama", "path": None, "repo_id": None, "private": False, "name": name, **sizes}


MODELS: dict[str, LlamaShape] = {
    "7b": LlamaShape("llama2-7b", dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008, vocab_size=32000),
    "70b": LlamaShape("llama2-70b", dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=32000),
}

# Small enough for a real dcp.save on CPU, uneven on purpose: 2 k/v rows leave some of 4 shards
# empty, 13 vocabulary rows split 4+4+4+1, and 10 feed-forward rows 3+3+3+1.
TINY = LlamaShape("tiny", dim=8, n_layers=2, n_heads=4, n_kv_heads=1, ffn_dim=10, vocab_size=13)
