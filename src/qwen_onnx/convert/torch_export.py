"""fp32 ONNX export of a Qwen Hugging Face folder through torch.onnx's own exporter (``dynamo=True``).

The second export route (``export.exporter: torch``, ``qwen-onnx export --exporter torch``), for
architectures that optimum-onnx does not know yet: optimum-onnx 0.1 pins transformers < 4.58, and a
new Qwen family reaches transformers first. ``torch.onnx.export(..., dynamo=True)`` captures the
model with ``torch.export`` and translates the ATen graph with onnxscript
(https://docs.pytorch.org/docs/stable/onnx_export.html), so any model that transformers runs and
``torch.export`` can trace exports, with no per-architecture ONNX config.

The graph keeps optimum's ``text-generation-with-past`` contract, so every later stage runs on it
unchanged:

- inputs ``input_ids`` int64 [batch_size, sequence_length], ``attention_mask`` int64
  [batch_size, past_sequence_length + sequence_length], ``position_ids`` int64
  [batch_size, sequence_length], per layer ``past_key_values.{i}.key`` / ``.value`` float32
  [batch_size, kv_heads, past_sequence_length, head_dim];
- outputs ``logits`` float32 [batch_size, sequence_length, vocab] and ``present.{i}.key`` /
  ``.value`` float32 [batch_size, kv_heads, past_sequence_length + sequence_length, head_dim].

The KV cache: transformers 4.57 passes a ``DynamicCache`` object, which neither ONNX nor
``torch.export`` takes as an input without registering it as a pytree node (transformers'
``integrations/executorch.register_dynamic_cache_export_support``; optimum and onnxruntime's
``models/llama/convert_to_onnx.py`` patch it similarly). :class:`FlatCacheDecoder` instead takes
the cache as flat tensors and builds the ``DynamicCache`` inside ``forward`` (its
``ddp_cache_data`` constructor), and returns the updated cache flat again: no pytree
registration, no patch of transformers. Attention runs ``eager`` (a float additive mask: a
left-padded row that sees no token gets a uniform softmax, never NaN).

Opset: the exporter writes opset 18 natively; asked for 17, it runs onnx's version converter, which
fails on the Qwen graph (torch 2.13, onnx 1.23: "axes_input_to_attribute ... No initializer or
constant input to node found": an opset-18 ``axes`` input it cannot turn back into an attribute) and
the exporter keeps opset 18 with a warning. This route therefore asks for ``opset >= 18``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from qwen_onnx.errors import ExportError, OptionError
from qwen_onnx.settings.defaults import TORCH_EXPORT_MIN_OPSET
from qwen_onnx.store.artifacts import require_hf_checkpoint

log = logging.getLogger(__name__)

#: The oldest opset the route writes (:data:`qwen_onnx.settings.defaults.TORCH_EXPORT_MIN_OPSET`).
MIN_OPSET = TORCH_EXPORT_MIN_OPSET
#: The oldest torch whose ``torch.onnx.export`` takes ``dynamo=True`` with ``dynamic_shapes``.
MIN_TORCH = (2, 6)

#: Example sizes traced by ``torch.export``: every dynamic axis above 1 (a size of 0 or 1 would be
#: specialised to a constant; https://pytorch.org/docs/stable/export.html, "0/1 specialization").
EXAMPLE_BATCH, EXAMPLE_SEQUENCE, EXAMPLE_PAST = 2, 3, 4

#: The dimension names of optimum's export (``optimum.exporters.onnx`` text-generation-with-past).
BATCH, SEQUENCE, PAST = "batch_size", "sequence_length", "past_sequence_length"
TOTAL = f"{PAST} + {SEQUENCE}"


def check_torch_exporter(opset: int) -> None:
    """Check that this environment can run the torch route at ``opset``.

    Raises:
        OptionError: ``opset`` below :data:`MIN_OPSET`.
        ExportError: torch older than :data:`MIN_TORCH`, or onnxscript missing (the exporter's
            translation library).
    """
    if opset < MIN_OPSET:
        raise OptionError(
            f"the torch exporter writes opset {MIN_OPSET} or newer (onnx's version converter cannot lower the "
            f"Qwen graph to {opset}); give --opset {MIN_OPSET} (config: export.opset: {MIN_OPSET}) or use the "
            "optimum exporter")
    import torch

    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        raise ExportError(
            f"the torch exporter needs torch >= {'.'.join(map(str, MIN_TORCH))} (torch.onnx.export with "
            f"dynamo=True), found torch {torch.__version__}; upgrade torch or use the optimum exporter")
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        raise ExportError("the torch exporter needs onnxscript (torch.onnx's translator), which is not installed; "
                          "pip install the onnxscript pinned in envs/requirements.txt or use the optimum exporter") from None


def _flat_cache_decoder(model):
    """The :class:`FlatCacheDecoder` of ``model`` (a transformers causal LM)."""
    import torch
    from transformers import DynamicCache

    class FlatCacheDecoder(torch.nn.Module):
        """A causal LM whose KV cache goes in and out as flat tensors, in layer order
        ``key_0, value_0, key_1, ...`` (each float32 [batch, kv_heads, past, head_dim])."""

        def __init__(self, inner, layers: int):
            super().__init__()
            self.inner = inner
            self.layers = layers

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layers)])
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:  # [B, kv_heads, past + S, head_dim] each
                present += [layer.keys, layer.values]
            return (out.logits, *present)  # logits [B, S, vocab]

    return FlatCacheDecoder(model, model.config.num_hidden_layers)


def io_names(layers: int) -> tuple[list[str], list[str]]:
    """Input and output names of the graph for ``layers`` decoder layers (optimum's names)."""
    cache = [(i, kind) for i in range(layers) for kind in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{i}.{k}" for i, k in cache)]
    return inputs, ["logits", *(f"present.{i}.{k}" for i, k in cache)]


def _rename_dims(proto, renames: dict[str, str]) -> None:
    """Rename symbolic dimensions (``dim_param``) in the graph's inputs, outputs and value infos."""
    for info in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def export_torch(hf_dir: str | os.PathLike, scratch: str | os.PathLike, *, opset: int) -> dict:
    """Export ``hf_dir`` with ``torch.onnx.export(dynamo=True)`` into ``scratch/model.onnx``.

    The weights go to the exporter's external data file beside it (``model.onnx.data``);
    :func:`qwen_onnx.convert.export.export_onnx` rewrites them into the variant folder's single
    ``model.onnx_data``. The graph is optimized by torch.onnx's default onnxscript pass
    (``optimize=True``: constant folding, dead code removal).

    Args:
        hf_dir: Hugging Face folder (fp32 safetensors).
        scratch: an existing empty folder.
        opset: ONNX opset, at least :data:`MIN_OPSET`.

    Returns:
        ``{"attn_implementation", "example_shapes", "nodes"}`` for ``export.json``.

    Raises:
        OptionError, ExportError: see :func:`check_torch_exporter`; ExportError also when
            ``torch.export`` cannot trace the model (the message carries torch's first line).
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint
            (:func:`~qwen_onnx.store.artifacts.require_hf_checkpoint`).
    """
    check_torch_exporter(opset)
    require_hf_checkpoint(hf_dir)
    import onnx
    import torch
    from transformers import AutoModelForCausalLM

    torch_model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    config = torch_model.config
    layers = config.num_hidden_layers
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    b, s, p = EXAMPLE_BATCH, EXAMPLE_SEQUENCE, EXAMPLE_PAST
    example = (
        torch.ones((b, s), dtype=torch.int64),  # input_ids [B, S]
        torch.ones((b, p + s), dtype=torch.int64),  # attention_mask [B, P + S]
        torch.arange(p, p + s, dtype=torch.int64).expand(b, s),  # position_ids [B, S]
        *(torch.zeros((b, kv_heads, p, head_dim), dtype=torch.float32) for _ in range(2 * layers)),
    )
    batch, sequence, past = torch.export.Dim(BATCH), torch.export.Dim(SEQUENCE), torch.export.Dim(PAST)
    dynamic_shapes = {
        "input_ids": {0: batch, 1: sequence},
        "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},  # renamed to TOTAL below
        "position_ids": {0: batch, 1: sequence},
        "past": tuple({0: batch, 2: past} for _ in range(2 * layers)),
    }
    input_names, output_names = io_names(layers)
    path = Path(scratch) / "model.onnx"
    started = time.time()
    try:
        with torch.no_grad():
            torch.onnx.export(
                _flat_cache_decoder(torch_model).eval(), example, str(path), input_names=input_names,
                output_names=output_names, dynamic_shapes=dynamic_shapes, opset_version=opset, dynamo=True,
                external_data=True, optimize=True, verify=False,
            )
    except Exception as exc:  # torch raises its own TorchExportError / ConversionError types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"torch.onnx.export (dynamo=True) failed on {hf_dir}: {first}; "
                          "use the optimum exporter for this model") from exc
    del torch_model
    log.info("torch.onnx.export: %.1f s", time.time() - started)
    proto = onnx.load(str(path), load_external_data=False)
    mask_dims = proto.graph.input[1].type.tensor_type.shape.dim
    if mask_dims[1].dim_param and mask_dims[1].dim_param != TOTAL:
        _rename_dims(proto, {mask_dims[1].dim_param: TOTAL})
        onnx.save_model(proto, str(path))  # tensors keep their references to model.onnx.data
    return {"attn_implementation": "eager", "example_shapes": {"batch": b, "sequence": s, "past": p},
            "nodes": len(proto.graph.node)}
