"""Write a seeded Qwen3-VL that a real SGLang server loads with random weights.

The study measures SGLang's main-process cost per image request (preprocessing, the
shared-memory copy of ``pixel_values``), which depends on the image processor and the
token layout, not on the language model's size. So a model directory that keeps the
real Qwen3-VL's processor geometry (16-pixel patches, 2x2 merge, 2-frame temporal
patches: a 512x512 image becomes 256 image tokens and ``pixel_values`` of shape
(1024, 1536) float32) but has a 64-wide, 2-layer text and vision stack lets a CPU-only
host run the real server. SGLang serves it with ``--load-format dummy``, which
initialises the weights at random from ``config.json``, so no weight file is written.

Everything is derived from ``TinyModelSettings`` (``tiny_model_settings``), the
tokenizer and processor files by ``tiny_model_processor``; every JSON file has sorted
keys and a fixed indent, so the same settings always give byte-identical files. This
module writes the model's config and the directory, built beside its destination and
renamed into place, so an interrupted write leaves nothing half-written. Shape
``qwen3-vl-4b`` writes the real Qwen3-VL-4B's sizes instead, with the same tokenizer
and processor files (``tiny_model_settings.ModelShape``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from serving_study.files import staged_directory
from serving_study.sources.model_snapshot import snapshot_files, snapshot_record
from serving_study.sources.tiny_model_processor import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    PATCH_SIZE,
    SPATIAL_MERGE_SIZE,
    SPECIAL_TOKENS,
    TEMPORAL_PATCH_SIZE,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    image_processor_config,
    tokenizer_config,
    train_tokenizer,
    video_processor_config,
)
from serving_study.sources.tiny_model_settings import (
    MAX_POSITION_EMBEDDINGS,
    TinyModelSettings,
)

ROPE_THETA = 5_000_000

# The real Qwen3-VL's 48x48 grid of learned vision positions (interpolated per image).
NUM_POSITION_EMBEDDINGS = 2304


def write_tiny_qwen3_vl(dest: Path, settings: TinyModelSettings) -> dict:
    """Write the tiny model's directory at ``dest`` (replacing any there) and return
    its snapshot record (``model_snapshot.snapshot_record``)."""
    dest = Path(dest).absolute()
    with staged_directory(dest) as staging:
        for name, content in model_files(settings).items():
            (staging / name).write_bytes(content)
        # mkdtemp's private mode would hide the model from a server run as another user.
        os.chmod(staging, 0o755)
    name = settings.model_shape.name
    record = snapshot_record(name, dest, snapshot_files(dest), origin="tiny")
    return record | {"load_format": "dummy", "settings": settings.as_dict()}


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
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return (text + "\n").encode()


def model_config(settings: TinyModelSettings, token_ids: Mapping[str, int]) -> dict:
    shape = settings.model_shape
    text_config = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": token_ids[ENDOFTEXT],
        "dtype": settings.dtype,
        "eos_token_id": token_ids[IM_END],
        "head_dim": shape.text_head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.text_hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.text_intermediate_size,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": shape.text_heads,
        "num_hidden_layers": shape.text_layers,
        "num_key_value_heads": shape.text_kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "mrope_interleaved": True,
            "mrope_section": list(shape.mrope_section),
            "rope_type": "default",
        },
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": shape.vocab_size or max(token_ids.values()) + 1,
    }
    vision_config = {
        # The block indexes whose features are also fed into the first text layers.
        "deepstack_visual_indexes": list(shape.deepstack_visual_indexes),
        "depth": shape.vision_depth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": shape.vision_hidden_size,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": shape.vision_intermediate_size,
        "model_type": "qwen3_vl",
        "num_heads": shape.vision_heads,
        "num_position_embeddings": NUM_POSITION_EMBEDDINGS,
        "out_hidden_size": shape.text_hidden_size,
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
