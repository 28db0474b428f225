"""The model zoo's transformers families: models built from their configs (no download), with
the library's own initialization (normal, std 0.02) and no dropout, wrapped to map token ids to
logits as the zoo's own models do. `bench/model_zoo.py --models hf-gpt2,hf-llama,...` runs them
(transformers installed: `pip install -e '.[transformers]' -c constraints.txt`)."""

from __future__ import annotations

import torch
from torch import nn

VOCAB, SEQ, CLASSES = 32, 12, 6  # the zoo's (bench/zoo_models.py)


class HFModel(nn.Module):
    """A transformers model of width `d`, 2 layers and 4 heads; forward(tokens) -> logits."""

    def __init__(self, family: str, d: int = 32) -> None:
        super().__init__()
        try:
            import transformers as tf
        except ImportError:
            raise SystemExit(
                f"{family} needs transformers: pip install -e '.[transformers]' -c constraints.txt"
            ) from None

        common = {"vocab_size": VOCAB}
        make = {
            "hf-gpt2": lambda: tf.GPT2LMHeadModel(
                tf.GPT2Config(n_embd=d, n_layer=2, n_head=4, n_positions=SEQ, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0, **common)
            ),
            "hf-llama": lambda: tf.LlamaForCausalLM(
                tf.LlamaConfig(hidden_size=d, intermediate_size=3 * d, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=SEQ, **common)
            ),
            "hf-gptneox": lambda: tf.GPTNeoXForCausalLM(
                tf.GPTNeoXConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=SEQ,
                                 rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0,
                                 **common)
            ),
            "hf-bert": lambda: tf.BertForSequenceClassification(
                tf.BertConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=2,
                              num_attention_heads=4, max_position_embeddings=SEQ,
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                              num_labels=CLASSES, **common)
            ),
        }  # fmt: skip
        self.model = make[family]()
        self.model.train()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits


def family(name: str):
    """A maker of `name`'s model taking the zoo's width argument `d`."""

    def make(d: int = 32) -> nn.Module:
        return HFModel(name, d)

    return make


HF_MODELS = {name: family(name) for name in ("hf-gpt2", "hf-llama", "hf-gptneox", "hf-bert")}
# the causal LMs among them: trained on next-token targets, as the zoo's GPT
HF_LANGUAGE_MODELS = {"hf-gpt2", "hf-llama", "hf-gptneox"}
