"""The tiny Qwen3-VL's processor files: tokenizer, chat template, media processors.

They keep the real Qwen3-VL's processor geometry, which is what makes the request path
realistic, and Qwen's special tokens. The byte-level BPE tokenizer is trained on a
corpus generated from the seed, so the same seed always gives the same tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from serving_study.sources.tiny_model_settings import (
    MAX_POSITION_EMBEDDINGS,
    TinyModelError,
)

# Qwen's special tokens, in Qwen's order; they get the ids right after the BPE vocab.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    VISION_START,
    VISION_END,
    VISION_PAD,
    IMAGE_PAD,
    VIDEO_PAD,
)

# The real Qwen3-VL's processor geometry: what makes the request path realistic.
PATCH_SIZE = 16
SPATIAL_MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
# Pixels per image: at least 256 merged tokens' worth, at most 16384.
IMAGE_MIN_PIXELS = 65536
IMAGE_MAX_PIXELS = 16777216
# Qwen3VLVideoProcessor's own defaults in transformers 5.19, written out so the file
# does not depend on the installed version's defaults.
VIDEO_MIN_PIXELS = 131072
VIDEO_MAX_PIXELS = 786432

# transformers 5's Qwen2Tokenizer rebuilds its pre-tokenizer with this pattern rather
# than reading the one in tokenizer.json, so tokenizer.json must use the same one for
# the `tokenizers` library and transformers to split text alike. It splits off English
# contractions, runs of letters (with one leading non-letter), single digits,
# punctuation runs and whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS_SENTENCES = 4000

# ChatML, one image or video placeholder per media item. Content may be a string or a
# list of items: SGLang hands over {"type": "image"}, Hugging Face processors
# {"type": "image", "image"/"url"/"path": ...}, OpenAI clients {"type": "image_url"}.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] in ['image', 'image_url', 'input_image'] -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] in ['video', 'video_url'] -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}"
    "{{- item['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

# Words a benchmark prompt is made of, mixed into the seeded corpus so that they come
# out as few tokens.
PROMPT_WORDS = (
    "describe this image in one sentence what is shown the picture a an of and to "
    "with on at for colour color shape left right top bottom answer question user "
    "assistant system you are helpful"
).split()


def tokenizer_config(token_ids: Mapping[str, int]) -> dict:
    added_tokens = {
        str(token_ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def image_processor_config() -> dict:
    """The real Qwen3-VL's image processor: Qwen2-VL's, torchvision backend ("Fast"
    is the name transformers 5 still maps to it), 16-pixel patches."""
    return _media_processor_config(IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS) | {
        "image_processor_type": "Qwen2VLImageProcessorFast"
    }


def video_processor_config() -> dict:
    return _media_processor_config(VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS) | {
        "do_sample_frames": True,
        "video_processor_type": "Qwen3VLVideoProcessor",
    }


def _media_processor_config(min_pixels: int, max_pixels: int) -> dict:
    """What the image and the video processor share: the geometry and the scaling."""
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": SPATIAL_MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": max_pixels, "shortest_edge": min_pixels},
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }


def train_tokenizer(seed: int, bpe_vocab_size: int) -> Tokenizer:
    """A byte-level BPE with ``bpe_vocab_size`` learned tokens, trained on the corpus
    of ``seed``, then the special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(seeded_corpus(seed), trainer=trainer)
    learned = tokenizer.get_vocab_size(with_added_tokens=False)
    if learned != bpe_vocab_size:
        raise TinyModelError(
            f"the seeded corpus yields only {learned} BPE tokens, not "
            f"{bpe_vocab_size}: lower bpe_vocab_size"
        )
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    return tokenizer


def seeded_corpus(seed: int) -> Iterator[str]:
    """Sentences of made-up words (a lexicon drawn from ``seed``) mixed with prompt
    words, with Zipf-like frequencies so the BPE learns distinct merges per seed."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwyz" for v in "aeiou"]
    lexicon = [
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        for _ in range(800)
    ] + list(PROMPT_WORDS)
    rng.shuffle(lexicon)
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]
    for _ in range(CORPUS_SENTENCES):
        words = rng.choices(lexicon, weights=weights, k=rng.randint(4, 16))
        if rng.random() < 0.2:
            words.append(str(rng.randint(0, 9999)))
        yield " ".join(words).capitalize() + rng.choice(".?!,")
