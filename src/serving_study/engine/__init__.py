"""The embedded engine: SGLang's request path, minus the model, on any Linux host.

`python -m serving_study.engine --sglang-source DIR ...` serves OpenAI chat
completions with images. The main process (`server`) decodes and preprocesses
each image on its event-loop thread (`request_path`, `preprocess`) and wraps
the tensor in the variant's own `ShmPointerMMData`, compiled from DIR's
`mm_utils.py` without importing SGLang (`shm_loader`). The spawned
`sglang::scheduler` process (`scheduler`) opens and materialises the segment
as that release does, then stands in for the GPU with a continuous-batching
timing model; tokens stream back over one pipe (`protocol`,
`scheduler_client`).
"""
