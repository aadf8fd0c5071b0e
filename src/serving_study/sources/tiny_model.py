"""Write a seeded tiny Qwen3-VL that a real SGLang server loads with random weights.

The study measures SGLang's main-process cost per image request (preprocessing, the
shared-memory copy of ``pixel_values``), which depends on the image processor and the
token layout, not on the language model's size. So a model directory that keeps the
real Qwen3-VL's processor geometry (16-pixel patches, 2x2 merge, 2-frame temporal
patches: a 512x512 image becomes 256 image tokens and ``pixel_values`` of shape
(1024, 1536) float32) but has a 64-wide, 2-layer text and vision stack lets a CPU-only
host run the real server. SGLang serves it with ``--load-format dummy``, which
initialises the weights at random from ``config.json``, so no weight file is written.

Everything is derived from ``TinyModelSettings``: the BPE tokenizer is trained on a
corpus generated from the seed, and every JSON file is written with sorted keys and a
fixed indent, so the same settings always give byte-identical files. The directory is
built beside its destination and renamed into place, so an interrupted write leaves
nothing half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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

from serving_study.sources.fetch import file_sha256

MODEL_NAME = "tiny-qwen3-vl"
# Part of the directory hash: bump it whenever the files written for the same settings
# change, so an old directory is never taken for the new layout.
GENERATOR_VERSION = 1
DTYPES = ("float32", "bfloat16")
CONFIG_KEYS = (
    "seed",
    "dtype",
    "text_hidden_size",
    "text_layers",
    "vision_hidden_size",
    "vision_depth",
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

# The text stack's attention shape is fixed: mrope_section must add up to half the
# head dimension (4 + 2 + 2 = 16 / 2), split over time, height and width.
TEXT_HEADS = 4
TEXT_KV_HEADS = 2
TEXT_HEAD_DIM = 16
MROPE_SECTION = (4, 2, 2)
VISION_HEADS = 4
MAX_POSITION_EMBEDDINGS = 32768
ROPE_THETA = 5_000_000

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
# The real Qwen3-VL's 48x48 grid of learned vision positions (interpolated per image).
NUM_POSITION_EMBEDDINGS = 2304

# transformers 5's Qwen2Tokenizer rebuilds its pre-tokenizer with this pattern rather
# than reading the one in tokenizer.json, so tokenizer.json must use the same one for
# the `tokenizers` library and transformers to split text alike. It splits off English
# contractions, runs of letters (with one leading non-letter), single digits,
# punctuation runs and whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_ALPHABET_SIZE = 256
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


class TinyModelError(ValueError):
    """The tiny-model settings are not ones a loadable model can be built from."""


@dataclass(frozen=True)
class TinyModelSettings:
    """Everything the tiny model's files depend on (the config's ``sglang.tiny_model``).

    ``bpe_vocab_size`` is the tokenizer's learned vocabulary: 256 byte tokens plus the
    merges; the special tokens come on top.
    """

    seed: int
    dtype: str = "bfloat16"
    text_hidden_size: int = 64
    text_layers: int = 2
    vision_hidden_size: int = 64
    vision_depth: int = 2
    bpe_vocab_size: int = 512

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise TinyModelError(
                f"tiny model dtype {self.dtype!r} is not one of {', '.join(DTYPES)}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TinyModelError(f"tiny model seed must be an integer: {self.seed!r}")
        for name in (
            "text_hidden_size",
            "text_layers",
            "vision_hidden_size",
            "vision_depth",
            "bpe_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TinyModelError(
                    f"tiny model {name} must be a positive integer, got {value!r}"
                )
        if self.vision_hidden_size % (2 * VISION_HEADS):
            raise TinyModelError(
                f"tiny model vision_hidden_size {self.vision_hidden_size} must split "
                f"into {VISION_HEADS} heads of an even size"
            )
        if self.bpe_vocab_size <= BYTE_ALPHABET_SIZE:
            raise TinyModelError(
                f"tiny model bpe_vocab_size {self.bpe_vocab_size} must be more than "
                f"the {BYTE_ALPHABET_SIZE} byte tokens"
            )

    @classmethod
    def from_config(cls, section: Mapping) -> TinyModelSettings:
        """Settings from the config's ``sglang.tiny_model`` section (defaults filled
        in by the schema); ``bpe_vocab_size`` is optional."""
        missing = [key for key in CONFIG_KEYS if key not in section]
        if missing:
            raise TinyModelError(f"sglang.tiny_model lacks {', '.join(missing)}")
        values = {key: section[key] for key in CONFIG_KEYS}
        if "bpe_vocab_size" in section:
            values["bpe_vocab_size"] = section["bpe_vocab_size"]
        return cls(**values)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def digest(self) -> str:
        """8 hex digits over every setting and the generator version."""
        identity = {"generator_version": GENERATOR_VERSION, **self.as_dict()}
        encoded = json.dumps(identity, sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()[:8]

    @property
    def directory_name(self) -> str:
        return f"{MODEL_NAME}-s{self.seed}-{self.dtype}-{self.digest}"


def write_tiny_qwen3_vl(dest: Path, settings: TinyModelSettings) -> dict:
    """Write the tiny model's directory at ``dest`` (replacing any there) and return
    its snapshot record, shaped like ``model_snapshot.ensure_model_snapshot``'s."""
    dest = Path(dest).absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    )
    try:
        for name, content in model_files(settings).items():
            (staging / name).write_bytes(content)
        # mkdtemp's private mode would hide the model from a server run as another user.
        os.chmod(staging, 0o755)
        replace_directory(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = {
        file.name: file_sha256(file)
        for file in sorted(dest.iterdir())
        if file.is_file()
    }
    return {
        "model": MODEL_NAME,
        "revision": None,
        "commit": None,
        "origin": "tiny",
        "path": str(dest),
        "files": files,
        "total_bytes": sum((dest / name).stat().st_size for name in files),
        "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_format": "dummy",
        "settings": settings.as_dict(),
    }


def replace_directory(staging: Path, dest: Path) -> None:
    """Rename ``staging`` to ``dest``; an existing ``dest`` is moved aside first and
    deleted only once the new directory is in place."""
    if not dest.exists():
        staging.rename(dest)
        return
    retired = Path(
        tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent)
    )
    dest.rename(retired / dest.name)
    staging.rename(dest)
    shutil.rmtree(retired, ignore_errors=True)


def model_files(settings: TinyModelSettings) -> dict[str, bytes]:
    """Every file of the model directory: relative name -> bytes."""
    tokenizer = train_tokenizer(settings.seed, settings.bpe_vocab_size)
    token_ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    return {
        "config.json": json_bytes(model_config(settings, token_ids)),
        "generation_config.json": json_bytes(generation_config(token_ids)),
        "tokenizer.json": json_bytes(json.loads(tokenizer.to_str())),
        "tokenizer_config.json": json_bytes(tokenizer_config(token_ids)),
        "chat_template.jinja": (CHAT_TEMPLATE + "\n").encode(),
        "preprocessor_config.json": json_bytes(image_processor_config()),
        "video_preprocessor_config.json": json_bytes(video_processor_config()),
    }


def json_bytes(value: dict) -> bytes:
    return (
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    ).encode()


def vocab_size(token_ids: Mapping[str, int]) -> int:
    """The embedding rows: exactly the tokenizer's ids, so every id the random model
    can sample decodes to a token."""
    return max(token_ids.values()) + 1


def model_config(settings: TinyModelSettings, token_ids: Mapping[str, int]) -> dict:
    text_config = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": token_ids[ENDOFTEXT],
        "dtype": settings.dtype,
        "eos_token_id": token_ids[IM_END],
        "head_dim": TEXT_HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": settings.text_hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": 3 * settings.text_hidden_size,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": TEXT_HEADS,
        "num_hidden_layers": settings.text_layers,
        "num_key_value_heads": TEXT_KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "mrope_interleaved": True,
            "mrope_section": list(MROPE_SECTION),
            "rope_type": "default",
        },
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": vocab_size(token_ids),
    }
    vision_config = {
        # The block index whose features are also fed into the first text layer.
        "deepstack_visual_indexes": [0],
        "depth": settings.vision_depth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": settings.vision_hidden_size,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4 * settings.vision_hidden_size,
        "model_type": "qwen3_vl",
        "num_heads": VISION_HEADS,
        "num_position_embeddings": NUM_POSITION_EMBEDDINGS,
        "out_hidden_size": settings.text_hidden_size,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": SPATIAL_MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "dtype": settings.dtype,
        "image_token_id": token_ids[IMAGE_PAD],
        "model_type": "qwen3_vl",
        "text_config": text_config,
        "tie_word_embeddings": True,
        "torch_dtype": settings.dtype,
        "video_token_id": token_ids[VIDEO_PAD],
        "vision_config": vision_config,
        "vision_end_token_id": token_ids[VISION_END],
        "vision_start_token_id": token_ids[VISION_START],
    }


def generation_config(token_ids: Mapping[str, int]) -> dict:
    """Stop tokens only: no sampling defaults, so a request's own sampling applies."""
    return {
        "bos_token_id": token_ids[ENDOFTEXT],
        "eos_token_id": [token_ids[IM_END], token_ids[ENDOFTEXT]],
        "pad_token_id": token_ids[ENDOFTEXT],
    }


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
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": SPATIAL_MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": IMAGE_MAX_PIXELS, "shortest_edge": IMAGE_MIN_PIXELS},
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }


def video_processor_config() -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_sample_frames": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": SPATIAL_MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": VIDEO_MAX_PIXELS, "shortest_edge": VIDEO_MIN_PIXELS},
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "video_processor_type": "Qwen3VLVideoProcessor",
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
