"""The tiny Qwen3-VL generator: the same settings give the same bytes, the seed
shapes the tokenizer, the config's token ids are the tokenizer's, the chat template
places the image tokens, an interrupted write leaves nothing, shape qwen3-vl-4b
writes the real Qwen3-VL-4B's sizes, and (slow) the real transformers 5.19
processor turns a 512x512 image into the real Qwen3-VL's shapes."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from serving_study.files import file_sha256
from serving_study.sources import tiny_model
from serving_study.sources.tiny_model import write_tiny_qwen3_vl
from serving_study.sources.tiny_model_processor import SPECIAL_TOKENS
from serving_study.sources.tiny_model_settings import TinyModelError, TinyModelSettings

SETTINGS = TinyModelSettings(seed=7)
# Every key of model_snapshot.ensure_model_snapshot's record, plus the tiny model's own.
RECORD_KEYS = {
    "model",
    "revision",
    "commit",
    "origin",
    "path",
    "files",
    "total_bytes",
    "checked_at",
    "load_format",
    "settings",
}
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def directory_bytes(directory: Path) -> dict[str, bytes]:
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_the_same_settings_give_byte_identical_directories(tmp_path):
    first = write_tiny_qwen3_vl(tmp_path / "first", SETTINGS)
    # A second process: the tokenizers library's hash maps are seeded per process.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path;"
            "from serving_study.sources.tiny_model import write_tiny_qwen3_vl;"
            "from serving_study.sources.tiny_model_settings import TinyModelSettings;"
            "write_tiny_qwen3_vl(Path(sys.argv[1]), TinyModelSettings(seed=7))",
            str(tmp_path / "second"),
        ],
        check=True,
    )

    first_files = directory_bytes(tmp_path / "first")
    assert first_files == directory_bytes(tmp_path / "second")
    assert set(first_files) == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
    }
    assert first["files"] == {
        name: file_sha256(tmp_path / "second" / name) for name in first_files
    }


def test_the_record_names_the_model_as_a_snapshot_record_does(tmp_path):
    record = write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)

    assert set(record) == RECORD_KEYS
    assert record["model"] == "tiny-qwen3-vl"
    assert (record["revision"], record["commit"]) == (None, None)
    assert record["origin"] == "tiny"
    assert record["load_format"] == "dummy"
    assert record["path"] == str((tmp_path / "model").absolute())
    assert record["settings"] == SETTINGS.as_dict()
    assert record["total_bytes"] == sum(
        len(content) for content in directory_bytes(tmp_path / "model").values()
    )
    # The record is what the shim writes as JSON.
    assert json.loads(json.dumps(record)) == record


def test_a_different_seed_gives_a_different_tokenizer(tmp_path):
    write_tiny_qwen3_vl(tmp_path / "seed7", SETTINGS)
    write_tiny_qwen3_vl(tmp_path / "seed8", TinyModelSettings(seed=8))

    merges = [
        json.loads((tmp_path / name / "tokenizer.json").read_text())["model"]["merges"]
        for name in ("seed7", "seed8")
    ]
    assert merges[0] != merges[1]
    assert len(merges[0]) == len(merges[1]) == SETTINGS.bpe_vocab_size - 256


def test_the_config_token_ids_are_the_tokenizer_special_token_ids(tmp_path):
    write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    tokenizer_config = json.loads(
        (tmp_path / "model" / "tokenizer_config.json").read_text()
    )
    tokenizer = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))

    assert config["image_token_id"] == tokenizer.token_to_id("<|image_pad|>")
    assert config["video_token_id"] == tokenizer.token_to_id("<|video_pad|>")
    assert config["vision_start_token_id"] == tokenizer.token_to_id("<|vision_start|>")
    assert config["vision_end_token_id"] == tokenizer.token_to_id("<|vision_end|>")
    assert config["text_config"]["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    # Every id the model can emit decodes, and no token lies outside the embedding.
    assert config["text_config"]["vocab_size"] == tokenizer.get_vocab_size()
    assert {
        int(token_id): entry["content"]
        for token_id, entry in tokenizer_config["added_tokens_decoder"].items()
    } == {tokenizer.token_to_id(token): token for token in SPECIAL_TOKENS}
    # A special token is one token wherever it appears in the text.
    tokens = tokenizer.encode("look" + IMAGE_PLACEHOLDER + "here").tokens
    start = tokens.index("<|vision_start|>")
    assert tokens[start : start + 3] == [
        "<|vision_start|>",
        "<|image_pad|>",
        "<|vision_end|>",
    ]


def test_the_config_follows_the_settings(tmp_path):
    settings = TinyModelSettings(
        seed=1,
        dtype="float32",
        text_hidden_size=128,
        text_layers=3,
        vision_hidden_size=96,
        vision_depth=4,
    )
    write_tiny_qwen3_vl(tmp_path / "model", settings)
    config = json.loads((tmp_path / "model" / "config.json").read_text())

    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert config["model_type"] == "qwen3_vl"
    assert config["dtype"] == config["torch_dtype"] == "float32"
    text, vision = config["text_config"], config["vision_config"]
    assert text["dtype"] == "float32"
    assert (text["hidden_size"], text["num_hidden_layers"]) == (128, 3)
    assert (vision["hidden_size"], vision["depth"]) == (96, 4)
    assert vision["out_hidden_size"] == 128
    assert sum(text["rope_scaling"]["mrope_section"]) * 2 == text["head_dim"]


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image"}, {"type": "text", "text": "Describe it."}],
        [
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "Describe it."},
        ],
    ],
)
def test_the_chat_template_writes_the_image_placeholder_per_image(tmp_path, content):
    jinja2 = pytest.importorskip(
        "jinja2", reason="jinja2 is not installed, so the template cannot be rendered"
    )
    write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)
    source = (tmp_path / "model" / "chat_template.jinja").read_text()
    config_source = json.loads(
        (tmp_path / "model" / "tokenizer_config.json").read_text()
    )["chat_template"]
    assert source.strip() == config_source
    template = jinja2.Environment().from_string(source)

    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": content},
    ]
    assert template.render(messages=messages, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        f"<|im_start|>user\n{IMAGE_PLACEHOLDER}Describe it.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    two_images = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}]
    assert template.render(messages=two_images, add_generation_prompt=False) == (
        f"<|im_start|>user\n{IMAGE_PLACEHOLDER}{IMAGE_PLACEHOLDER}<|im_end|>\n"
    )


def fail_before_rename(*_args):
    raise KeyboardInterrupt("interrupted after the files, before the rename")


def test_an_interrupted_write_leaves_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny_model.os, "chmod", fail_before_rename)

    with pytest.raises(KeyboardInterrupt):
        write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)

    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_rewrite_keeps_the_previous_directory(tmp_path, monkeypatch):
    write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)
    before = directory_bytes(tmp_path / "model")
    monkeypatch.setattr(tiny_model.os, "chmod", fail_before_rename)

    with pytest.raises(KeyboardInterrupt):
        write_tiny_qwen3_vl(tmp_path / "model", TinyModelSettings(seed=8))

    assert [path.name for path in tmp_path.iterdir()] == ["model"]
    assert directory_bytes(tmp_path / "model") == before


def test_a_rewrite_replaces_the_directory(tmp_path):
    write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)
    (tmp_path / "model" / "stale.txt").write_text("left from before")

    record = write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)

    assert "stale.txt" not in record["files"]
    assert [path.name for path in tmp_path.iterdir()] == ["model"]
    assert sorted(path.name for path in (tmp_path / "model").iterdir()) == sorted(
        record["files"]
    )


def test_settings_come_from_the_config_section_and_name_the_directory():
    section = {
        "seed": 3,
        "dtype": "float32",
        "text_hidden_size": 64,
        "text_layers": 2,
        "vision_hidden_size": 64,
        "vision_depth": 2,
    }
    settings = TinyModelSettings.from_config(section)

    assert settings == TinyModelSettings(seed=3, dtype="float32")
    name = settings.directory_name
    assert name.startswith("tiny-qwen3-vl-s3-float32-")
    assert len(name.rsplit("-", 1)[1]) == 8
    assert TinyModelSettings.from_config(section).directory_name == name
    assert (
        TinyModelSettings.from_config(section | {"text_layers": 3}).directory_name
        != name
    )
    with pytest.raises(TinyModelError, match="vision_depth"):
        TinyModelSettings.from_config(
            {key: value for key, value in section.items() if key != "vision_depth"}
        )


def test_the_4b_shape_writes_the_real_qwen3_vl_4b_sizes(tmp_path):
    """The sizes of Qwen/Qwen3-VL-4B-Instruct's config.json, the tiny tokenizer's
    special-token ids, and the real vocabulary's size."""
    settings = TinyModelSettings.from_config(
        {"seed": 0, "dtype": "bfloat16", "shape": "qwen3-vl-4b"}
        | {key: 64 for key in ("text_hidden_size", "vision_hidden_size")}
        | {key: 2 for key in ("text_layers", "vision_depth")}
    )
    record = write_tiny_qwen3_vl(tmp_path / "model", settings)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    text, vision = config["text_config"], config["vision_config"]

    assert record["model"] == "qwen3-vl-4b-shape" and record["load_format"] == "dummy"
    assert settings.directory_name.startswith("qwen3-vl-4b-shape-s0-bfloat16-")
    assert {
        key: text[key]
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        )
    } == {
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "vocab_size": 151936,
    }
    assert text["rope_scaling"]["mrope_section"] == [24, 20, 20]
    assert sum(text["rope_scaling"]["mrope_section"]) * 2 == text["head_dim"]
    assert (vision["depth"], vision["hidden_size"], vision["num_heads"]) == (
        24,
        1024,
        16,
    )
    assert vision["intermediate_size"] == 4096 and vision["out_hidden_size"] == 2560
    assert vision["deepstack_visual_indexes"] == [5, 11, 17]
    tokenizer = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    assert config["image_token_id"] == tokenizer.token_to_id("<|image_pad|>")
    assert config["image_token_id"] < 1024  # the tiny tokenizer's, not Qwen's 151655


def test_a_tiny_model_keeps_the_name_and_bytes_its_published_runs_recorded(tmp_path):
    """Shapes came after the CPU results were published: a tiny model's directory
    (its settings' digest) and every file are still those their runs served."""
    settings = TinyModelSettings(seed=0, dtype="float32")
    published = Path(__file__).parents[1] / "docs/results/sglang-cpu/tiny-model.json"
    record = json.loads(published.read_text())
    assert f"/{settings.directory_name}/" in record["path"]
    assert write_tiny_qwen3_vl(tmp_path / "model", settings)["files"] == record["files"]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"shape": "qwen3-vl-8b"}, "shape"),
        ({"dtype": "float16"}, "dtype"),
        ({"seed": "7"}, "seed"),
        ({"text_layers": 0}, "text_layers"),
        ({"vision_hidden_size": 66}, "vision_hidden_size"),
        ({"bpe_vocab_size": 256}, "bpe_vocab_size"),
    ],
)
def test_settings_that_cannot_make_a_model_are_refused(values, message):
    with pytest.raises(TinyModelError, match=message):
        TinyModelSettings(**({"seed": 1} | values))


# Run in the server's Python: the real processor, as SGLang's main process loads it.
PROCESSOR_CHECK = textwrap.dedent(
    """
    import json, sys
    import transformers
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor

    model = sys.argv[1]
    config = AutoConfig.from_pretrained(model)
    processor = AutoProcessor.from_pretrained(model)
    messages = [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.effect_noise((512, 512), 64).convert("RGB")
    inputs = processor(text=[prompt], images=[image], return_tensors="pt")
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    print(json.dumps({
        "transformers": transformers.__version__,
        "model_type": config.model_type,
        "processor": type(processor).__name__,
        "prompt": prompt,
        "pixel_values_shape": list(inputs["pixel_values"].shape),
        "pixel_values_dtype": str(inputs["pixel_values"].dtype),
        "image_grid_thw": inputs["image_grid_thw"].tolist(),
        "image_pad_tokens": inputs["input_ids"][0].tolist().count(image_pad),
        "image_token_id": config.image_token_id,
        "image_pad_id": image_pad,
    }))
    """
)


@pytest.mark.slow
def test_the_real_processor_gives_qwen3_vl_shapes_for_a_512_image(
    tmp_path, sglang_cpu_runtime
):
    # transformers 5.19.0, torch and torchvision: the real server's own runtime.
    runtime_python = sglang_cpu_runtime["python"]
    write_tiny_qwen3_vl(tmp_path / "model", SETTINGS)

    result = subprocess.run(
        [runtime_python, "-c", PROCESSOR_CHECK, str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    checked = json.loads(result.stdout.strip().splitlines()[-1])

    assert checked["transformers"] == "5.19.0"
    assert checked["model_type"] == "qwen3_vl"
    assert checked["processor"] == "Qwen3VLProcessor"
    assert IMAGE_PLACEHOLDER in checked["prompt"]
    assert checked["pixel_values_shape"] == [1024, 1536]
    assert checked["pixel_values_dtype"] == "torch.float32"
    assert checked["image_grid_thw"] == [[1, 32, 32]]
    assert checked["image_pad_tokens"] == 256
    assert checked["image_token_id"] == checked["image_pad_id"]
