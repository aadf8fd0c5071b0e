"""The settings a seeded Qwen3-VL with random weights is built from, and its shape.

``TinyModelSettings`` is the config's ``sglang.tiny_model`` section; its digest names
the model's directory, so different settings never share one. Its ``shape`` is
``tiny`` (a 64-wide, 2-layer model for CPU hosts, sized by the settings) or
``qwen3-vl-4b``: every size of the real Qwen3-VL-4B-Instruct (its ``config.json``),
for a GPU host, whose scheduler then does the real model's work per image.
``ModelShape`` holds what either gives the model's config.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from serving_study.config.schema import property_schema

MODEL_NAME = "tiny-qwen3-vl"
# Part of the directory hash: bump it whenever the files written for the same settings
# change, so an old directory is never taken for the new layout.
GENERATOR_VERSION = 1
DTYPES = tuple(property_schema("sglang", "tiny_model", "dtype")["enum"])
DEFAULT_DTYPE = property_schema("sglang", "tiny_model", "dtype")["default"]
SHAPES = tuple(property_schema("sglang", "tiny_model", "shape")["enum"])
TINY = "tiny"
# The model's sizes (shape tiny), each a positive integer.
SIZE_KEYS = ("text_hidden_size", "text_layers", "vision_hidden_size", "vision_depth")
CONFIG_KEYS = ("seed", "dtype", *SIZE_KEYS)
OPTIONAL_KEYS = ("shape", "bpe_vocab_size")

# Shape tiny's attention: the vision stack's heads (vision_hidden_size must split
# into them evenly), and the text stack's, whose mrope_section adds up to half the
# head dimension (4 + 2 + 2 = 16 / 2), split over time, height and width.
VISION_HEADS = 4
TEXT_HEADS = 4
TEXT_KV_HEADS = 2
TEXT_HEAD_DIM = 16
MROPE_SECTION = (4, 2, 2)
# The context length, of the model and of its tokenizer alike.
MAX_POSITION_EMBEDDINGS = 32768
# The byte tokens every BPE vocabulary starts with.
BYTE_ALPHABET_SIZE = 256


class TinyModelError(ValueError):
    """The tiny-model settings are not ones a loadable model can be built from."""


@dataclass(frozen=True)
class ModelShape:
    """Every size of the model's config. ``vocab_size`` None: exactly the
    tokenizer's ids, so every id the random model samples decodes."""

    name: str
    text_hidden_size: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_head_dim: int
    text_intermediate_size: int
    mrope_section: tuple[int, int, int]
    vocab_size: int | None
    vision_hidden_size: int
    vision_depth: int
    vision_heads: int
    vision_intermediate_size: int
    deepstack_visual_indexes: tuple[int, ...]


# Qwen/Qwen3-VL-4B-Instruct's config.json. Its vocabulary keeps the real size (the
# language model head's cost), though the tiny tokenizer names only its first ids.
QWEN3_VL_4B = ModelShape(
    name="qwen3-vl-4b-shape",
    text_hidden_size=2560,
    text_layers=36,
    text_heads=32,
    text_kv_heads=8,
    text_head_dim=128,
    text_intermediate_size=9728,
    mrope_section=(24, 20, 20),
    vocab_size=151936,
    vision_hidden_size=1024,
    vision_depth=24,
    vision_heads=16,
    vision_intermediate_size=4096,
    deepstack_visual_indexes=(5, 11, 17),
)


@dataclass(frozen=True)
class TinyModelSettings:
    """Everything the tiny model's files depend on (the config's ``sglang.tiny_model``).

    ``bpe_vocab_size`` is the tokenizer's learned vocabulary: 256 byte tokens plus the
    merges; the special tokens come on top.
    """

    seed: int
    dtype: str = DEFAULT_DTYPE
    text_hidden_size: int = 64
    text_layers: int = 2
    vision_hidden_size: int = 64
    vision_depth: int = 2
    bpe_vocab_size: int = 512
    shape: str = TINY

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise TinyModelError(
                f"model shape {self.shape!r} is not one of {', '.join(SHAPES)}"
            )
        if self.dtype not in DTYPES:
            raise TinyModelError(
                f"tiny model dtype {self.dtype!r} is not one of {', '.join(DTYPES)}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TinyModelError(f"tiny model seed must be an integer: {self.seed!r}")
        for name in (*SIZE_KEYS, "bpe_vocab_size"):
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
        in by the schema); ``shape`` and ``bpe_vocab_size`` are optional."""
        missing = [key for key in CONFIG_KEYS if key not in section]
        if missing:
            raise TinyModelError(f"sglang.tiny_model lacks {', '.join(missing)}")
        values = {
            key: section[key]
            for key in (*CONFIG_KEYS, *OPTIONAL_KEYS)
            if key in section
        }
        return cls(**values)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def model_shape(self) -> ModelShape:
        """The model's sizes: the settings' own for shape tiny."""
        if self.shape != TINY:
            return QWEN3_VL_4B
        return ModelShape(
            name=MODEL_NAME,
            text_hidden_size=self.text_hidden_size,
            text_layers=self.text_layers,
            text_heads=TEXT_HEADS,
            text_kv_heads=TEXT_KV_HEADS,
            text_head_dim=TEXT_HEAD_DIM,
            text_intermediate_size=3 * self.text_hidden_size,
            mrope_section=MROPE_SECTION,
            vocab_size=None,
            vision_hidden_size=self.vision_hidden_size,
            vision_depth=self.vision_depth,
            vision_heads=VISION_HEADS,
            vision_intermediate_size=4 * self.vision_hidden_size,
            # The block whose features also feed the first text layer.
            deepstack_visual_indexes=(0,),
        )

    @property
    def digest(self) -> str:
        """8 hex digits over every setting and the generator version (shape tiny
        left out, so a tiny model keeps the name it had before shapes)."""
        settings = self.as_dict()
        if self.shape == TINY:
            del settings["shape"]
        identity = {"generator_version": GENERATOR_VERSION, **settings}
        encoded = json.dumps(identity, sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()[:8]

    @property
    def directory_name(self) -> str:
        return f"{self.model_shape.name}-s{self.seed}-{self.dtype}-{self.digest}"
