"""The settings a seeded tiny Qwen3-VL is built from, checked against its fixed shape.

``TinyModelSettings`` is the config's ``sglang.tiny_model`` section; its digest names
the model's directory, so different settings never share one.
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
# The model's sizes, each a positive integer.
SIZE_KEYS = ("text_hidden_size", "text_layers", "vision_hidden_size", "vision_depth")
CONFIG_KEYS = ("seed", "dtype", *SIZE_KEYS)

# The vision stack's heads: vision_hidden_size must split into them evenly.
VISION_HEADS = 4
# The context length, of the model and of its tokenizer alike.
MAX_POSITION_EMBEDDINGS = 32768
# The byte tokens every BPE vocabulary starts with.
BYTE_ALPHABET_SIZE = 256


class TinyModelError(ValueError):
    """The tiny-model settings are not ones a loadable model can be built from."""


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

    def __post_init__(self) -> None:
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
