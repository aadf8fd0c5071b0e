"""The main process's CPU per image, split: the image processor and the SHM copy.

Run by file path with a real server's runtime, the variant's tree first on
PYTHONPATH and the arm's thread knobs in the environment (standard library, torch,
transformers and the variant's SGLang only; nothing of serving_study), as
``main_process_steps.py`` does::

    <runtime python> -P main_process_costs.py MODEL_DIR IMAGE [IMAGE ...]

For each image, the main process's two big steps are repeated as the server makes
them: the Hugging Face processor on the decoded image (the PIL/numpy one, which the
experiment selects with ``--image-processor-backend pil``) and the variant's own
``ShmPointerMMData`` around the resulting ``pixel_values`` (its copy into a new
shared-memory segment; the segment is then unlinked, as the scheduler would).
CPU time is the process's, all threads included (``time.process_time``), so an
OpenMP pool's spinning workers count as they do under a quota. One JSON object
goes to stdout: milliseconds of CPU per image for each step, and torch's threads.
"""

import json
import pickle
import sys
import time


def received(wrapped) -> None:
    """What the scheduler does with it: unpickle, map, unlink the segment."""
    pickle.loads(pickle.dumps(wrapped)).materialize()


def main(model_directory: str, image_paths: list[str]) -> dict:
    import torch
    from PIL import Image
    from sglang.srt.managers.mm_utils import ShmPointerMMData
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model_directory, use_fast=False)
    images = []
    for path in image_paths:
        with Image.open(path) as image:
            images.append(image.convert("RGB"))
    # One untimed round: lazy imports and first-call allocations stay out.
    pixel_values = processor(images=images[:1], return_tensors="pt")["pixel_values"]
    received(ShmPointerMMData(pixel_values.contiguous()))

    processor_seconds = copy_seconds = 0.0
    for image in images:
        started = time.process_time()
        pixel_values = processor(images=[image], return_tensors="pt")["pixel_values"]
        processor_seconds += time.process_time() - started
        tensor = pixel_values.contiguous()
        started = time.process_time()
        wrapped = ShmPointerMMData(tensor)
        copy_seconds += time.process_time() - started
        received(wrapped)
    count = len(images)
    return {
        "images": count,
        "torch_threads": torch.get_num_threads(),
        "pixel_values_shape": list(pixel_values.shape),
        "processor_cpu_ms_per_image": 1000 * processor_seconds / count,
        "shm_copy_cpu_ms_per_image": 1000 * copy_seconds / count,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
