"""The model zoo's transformers families: models built from their configs (no download), with
the library's own initialization (normal, std 0.02) and no dropout, wrapped to map token ids to
logits as the zoo's own models do. `bench/model_zoo.py --models hf-gpt2,hf-llama,...` runs them
(transformers installed: `pip install -e '.[transformers]' -c constraints.txt`). The mixtures of
experts (`hf-mixtral`, `hf-qwen2moe` with its gated shared expert, `hf-gptoss` with its experts'
biases) keep their experts fused, one tensor of three axes with the experts first, as the
library does since its version 5; their router's auxiliary loss stays off (it is not a sum over
samples: `moe-balance` is the zoo's case of one)."""

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
            "hf-mixtral": lambda: tf.MixtralForCausalLM(
                tf.MixtralConfig(hidden_size=d, intermediate_size=2 * d, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 num_local_experts=4, num_experts_per_tok=2,
                                 max_position_embeddings=SEQ, **common)
            ),
            "hf-qwen2moe": lambda: tf.Qwen2MoeForCausalLM(
                tf.Qwen2MoeConfig(hidden_size=d, intermediate_size=2 * d, moe_intermediate_size=d,
                                  shared_expert_intermediate_size=2 * d, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                  num_experts_per_tok=2, max_position_embeddings=SEQ, **common)
            ),
            "hf-gptoss": lambda: tf.GptOssForCausalLM(
                tf.GptOssConfig(hidden_size=d, intermediate_size=d, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=d // 4,
                                num_local_experts=4, num_experts_per_tok=2,
                                max_position_embeddings=SEQ, sliding_window=SEQ - 4,
                                layer_types=["sliding_attention", "full_attention"],
                                rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                                **common)
            ),
            "hf-opt": lambda: tf.OPTForCausalLM(
                tf.OPTConfig(hidden_size=d, ffn_dim=4 * d, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=SEQ,
                             word_embed_proj_dim=d, dropout=0.0, attention_dropout=0.0,
                             **common)
            ),
            "hf-bloom": lambda: tf.BloomForCausalLM(
                tf.BloomConfig(hidden_size=d, n_layer=2, n_head=4, hidden_dropout=0.0,
                               attention_dropout=0.0, **common)
            ),
            "hf-gemma2": lambda: tf.Gemma2ForCausalLM(
                tf.Gemma2Config(hidden_size=d, intermediate_size=3 * d, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=d // 4,
                                max_position_embeddings=SEQ, sliding_window=SEQ - 4, **common)
            ),
            "hf-deberta": lambda: tf.DebertaV2ForSequenceClassification(
                tf.DebertaV2Config(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=SEQ,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   num_labels=CLASSES, **common)
            ),
        }  # fmt: skip
        self.model = make[family]()
        self.model.train()

    def double(self) -> HFModel:
        """float64, a mixture of experts computed by transformers' eager loop (its default,
        grouped_mm, takes no float64 matrices), as gradalign's `float64_reference` does."""
        from gradalign.record.integrations.transformers_float64 import eager_experts

        super().double()
        eager_experts(self.model)
        return self

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits


def family(name: str):
    """A maker of `name`'s model taking the zoo's width argument `d`."""

    def make(d: int = 32) -> nn.Module:
        return HFModel(name, d)

    return make


HF_LANGUAGE_MODELS = {
    "hf-gpt2", "hf-llama", "hf-gptneox", "hf-mixtral", "hf-qwen2moe", "hf-gptoss", "hf-opt",
    "hf-bloom", "hf-gemma2",
}  # fmt: skip
# the causal LMs above (trained on next-token targets, as the zoo's GPT) and two classifiers
HF_MODELS = {name: family(name) for name in (*sorted(HF_LANGUAGE_MODELS), "hf-bert", "hf-deberta")}
