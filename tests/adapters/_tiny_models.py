"""Tiny BERT / RoBERTa checkpoints built on the fly (no download): config + trained tokenizer.

The random weights come from a private seed, not from torch's global generator: a checkpoint
built from whatever state earlier tests left in the global generator made tests' inputs depend
on which tests ran before them in the process (AMCL's bf16 step fell outside its tolerance for
some of those weights), and building one would shift the global stream for later tests.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "a man is playing a guitar .", "a woman is slicing an onion .", "the cat sits on the mat .",
    "two dogs run across the field .", "a child is reading a book .", "the sun is shining today .",
    "people are walking in the park .", "a chef cooks dinner in the kitchen .",
]


def build_tiny_model(directory: Path, architecture: str = "roberta", seed: int = 0) -> Path:
    """Write a tiny ``architecture`` checkpoint and its tokenizer to ``directory``; the same
    ``seed`` gives the same weights whatever the global RNG state, which it leaves untouched."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import (
        BertConfig,
        BertModel,
        PreTrainedTokenizerFast,
        RobertaConfig,
        RobertaModel,
    )

    directory.mkdir(parents=True, exist_ok=True)
    if architecture == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        cls, sep, pad, unk, mask = "<s>", "</s>", "<pad>", "<unk>", "<mask>"
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        cls, sep, pad, unk, mask = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
    tok = Tokenizer(models.WordLevel(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS * 3, trainers.WordLevelTrainer(special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    # BERT's tokenizer has no BOS/EOS (transformers would warn, aligning the model's config)
    ends = dict(bos_token=cls, eos_token=sep) if architecture == "roberta" else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **ends, cls_token=cls, sep_token=sep,
                                   pad_token=pad, unk_token=unk, mask_token=mask,
                                   model_max_length=64)
    fast.save_pretrained(directory)
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=37, max_position_embeddings=80,
                  pad_token_id=tok.token_to_id(pad))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if architecture == "roberta":
            model = RobertaModel(RobertaConfig(**common, bos_token_id=tok.token_to_id(cls),
                                               eos_token_id=tok.token_to_id(sep)))
        else:
            model = BertModel(BertConfig(**common))
    model.save_pretrained(directory)
    return directory
