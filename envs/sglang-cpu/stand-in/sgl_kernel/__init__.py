"""Stand-in for sgl-kernel's CPU build, which is not on PyPI (PyPI's
``sglang-kernel`` is the CUDA build).

With ``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 imports names from ``sgl_kernel``
and binds ``torch.ops.sgl_kernel.*_cpu`` ops at import time, in the main process,
the scheduler and the detokenizer. Of those, only the scheduler's KV bookkeeping
(``assign_req_to_token_pool_cpu``) has a meaning on our path, so it is written here
in plain torch; every other name is a placeholder that raises if called. The
package deliberately lacks ``convert_weight_packed``, so SGLang's
``cpu_has_amx_support()`` is false and every layer takes SGLang's own plain-torch
fallback; no other op is registered either, because SGLang probes some with
``hasattr`` and would then call them.

Each placeholder call, and the first call of the real op in each process, prints
one line to stderr, so a server's log shows who called what::

    serving-study stand-in: [placeholder ]<op> called in pid <pid> (<title>)
"""

import os
import sys
from collections.abc import Callable
from typing import NoReturn

import torch

# Imported by name (``from sgl_kernel import ...``) in modules SGLang loads on CPU.
PLACEHOLDER_FUNCTIONS = (
    "copy_all_layer_kv_cache_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
)
# Bound as ``torch.ops.sgl_kernel.<name>`` at import time (models/qwen3_5.py).
PLACEHOLDER_OPS = (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
)

_announced_calls: set[tuple[int, str]] = set()


def _process_title() -> str:
    """This process's title (``sglang::scheduler`` once SGLang set it), else argv."""
    setproctitle = sys.modules.get("setproctitle")
    if setproctitle is not None:
        title = setproctitle.getproctitle()
    else:
        with open("/proc/self/cmdline", "rb") as cmdline:
            title = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    return " ".join(title.split())  # one line, even for ``python -c`` scripts


def _announce(op: str, kind: str = "") -> None:
    print(
        f"serving-study stand-in: {kind}{op} called in pid {os.getpid()}"
        f" ({_process_title()})",
        file=sys.stderr,
        flush=True,
    )


def _placeholder(op: str) -> Callable[..., NoReturn]:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        _announce(op, kind="placeholder ")
        raise NotImplementedError(
            f"sgl_kernel.{op} is a placeholder of serving-study's CPU stand-in"
            " (envs/sglang-cpu/stand-in); SGLang was not expected to call it"
        )

    refuse.__name__ = op
    refuse.default = refuse  # SGLang calls some ops as ``op.default(...)``
    return refuse


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the req->token table.

    Request ``i`` owns row ``req_pool_indices[i]``; its positions
    ``start_offset[i]:end_offset[i]`` get the next ``end - start`` slots of
    ``out_cache_loc``, which holds the batch's slots request after request (what
    SGLang's Triton ``assign_req_to_token_pool`` does on a GPU).
    """
    if (os.getpid(), "assign_req_to_token_pool_cpu") not in _announced_calls:
        _announced_calls.add((os.getpid(), "assign_req_to_token_pool_cpu"))
        _announce("assign_req_to_token_pool_cpu")
    taken = 0
    for row, start, end in zip(
        req_pool_indices.tolist(),
        start_offset.tolist(),
        end_offset.tolist(),
        strict=True,
    ):
        if end > pool_len:
            raise IndexError(f"KV position {end} is past the table's width {pool_len}")
        req_to_token[row, start:end] = out_cache_loc[taken : taken + end - start]
        taken += end - start


for _name in PLACEHOLDER_FUNCTIONS:
    globals()[_name] = _placeholder(_name)
# torch.ops.sgl_kernel is one namespace object per process; a name set on it is
# found before torch looks for a registered operator of that name.
for _name in PLACEHOLDER_OPS:
    setattr(torch.ops.sgl_kernel, _name, _placeholder(_name))
