"""Tiny offline tokenizers and models: the default task, the tests and the smoke scripts build theirs here.

The tokenizer is character-level, made with `tokenizers` (nothing is downloaded):
<pad>=0, <eos>=1, <unk>=2, then the added tokens, then one id per character. With
`chat=True` it also knows ChatML's <|im_start|> and <|im_end|> and carries a ChatML chat
template, like Qwen's instruct models.

The models are a few layers of Llama, Qwen2 (q/k/v biases) or Qwen3 (q/k RMSNorm) built
from a config with random weights. head_dim is 32 by default because vLLM's CPU attention
refuses head_dim 16, and the vocabulary is the tokenizer's length because vLLM samples ids
up to the model's vocab_size.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
PAD_ID, EOS_ID = 0, 1
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"
CHATML = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FAMILIES: dict[str, tuple[type, type[PreTrainedModel]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v projections with biases; head_dim = hidden / heads
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # RMSNorm on q and k, explicit head_dim
}


def build_tokenizer(
    characters: str = CHARACTERS, added: Sequence[str] = (), chat: bool = False
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer; each of `added` is one (non-special) token.

    chat=True adds <|im_start|> and <|im_end|> as special tokens and a ChatML template.
    """
    specials = [PAD, EOS, UNK] + ([IM_START, IM_END] if chat else [])
    vocab = [*specials[:3], *added, *specials[3:], *characters]
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocab)}, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # newlines too
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_tokens([AddedToken(token, normalized=False) for token in added])
    tokenizer.add_special_tokens([AddedToken(token) for token in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        chat_template=CHATML if chat else None,
    )


def build_model(
    family: str,
    vocab_size: int,
    *,
    tied: bool = True,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 32,
    intermediate_size: int = 128,
    max_positions: int = 512,
    initializer_range: float = 0.02,
    seed: int = 0,
    **extra: Any,
) -> PreTrainedModel:
    """A `family` causal LM with random weights (float32, eval mode); GQA when kv_heads < heads.

    `extra` goes to the config as is (e.g. bos_token_id).
    """
    config_cls, model_cls = FAMILIES[family]
    sizes = {"head_dim": head_dim} if family != "qwen2" else {}
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=num_heads * head_dim,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        initializer_range=initializer_range,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        **{"bos_token_id": None, **sizes, **extra},
    )
    torch.manual_seed(seed)
    return model_cls(config).float().eval()


def save_tiny_model(
    folder: str | Path,
    family: str = "llama",
    *,
    chat: bool = False,
    generation_config: dict[str, Any] | None = None,
    **model_options: Any,
) -> PreTrainedModel:
    """Build a tokenizer and a `family` model for it, save both to `folder`; returns the model.

    `generation_config`, when given, is written as the checkpoint's generation_config.json
    (token names such as "<|im_end|>" in its eos_token_id are turned into ids).
    """
    tokenizer = build_tokenizer(chat=chat)
    model = build_model(family, len(tokenizer), **model_options)
    if generation_config is not None:
        settings = dict(generation_config)
        if "eos_token_id" in settings:
            settings["eos_token_id"] = [
                tokenizer.convert_tokens_to_ids(t) if isinstance(t, str) else t for t in settings["eos_token_id"]
            ]
        model.generation_config = GenerationConfig(**settings)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model
