"""The ``tflite`` variant: a Qwen Hugging Face folder converted to LiteRT (TFLite) through litert-torch.

litert-torch (https://github.com/google-ai-edge/litert-torch; formerly ai-edge-torch) re-authors
the decoder with its own layers (``litert_torch.generative.utilities.model_builder``), loads the
Hugging Face safetensors into them, and converts two signatures into one ``.tflite`` file, as its
Qwen example does (``litert_torch/generative/examples/qwen/convert_to_tflite.py``):

- ``prefill_<prefill_length>``: ``tokens`` int32 [1, prefill_length], ``input_pos`` int32
  [prefill_length] and the KV cache in, the updated KV cache and ``logits`` float32
  [1, prefill_length, vocab] out (every position: ``ExportConfig(output_logits_on_prefill=True)``);
- ``decode``: ``tokens`` int32 [1, 1], ``input_pos`` int32 [1] and the KV cache in, the updated KV
  cache and ``logits`` float32 [1, 1, vocab] out.

The KV cache is explicit: ``kv_cache_k_{i}`` and ``kv_cache_v_{i}`` float32
[1, kv_cache_length, kv_heads, head_dim] per layer, fed back by the caller (:class:`TfliteCausalLM`).
The causal mask is built inside the graph from ``input_pos`` (a mask cache of kv_cache_length rows).

The folder holds ``model.tflite``, the Hugging Face config and tokenizer files, ``tflite.json``
(the signatures with their tensors, the lengths, the quantization, the versions, the conversion's
seconds and peak RSS) and ``manifest.json``.

litert-torch (``envs/tflite.txt``) lives in the TFLite environment, ``.venv-tflite``, not in ``.venv``;
this module imports it only inside the functions that need it, and :func:`convert_tflite` checks its
inputs where it is called and converts there or in that environment
(:func:`qwen_onnx.run.tflite_env.call_with_litert`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from qwen_onnx.errors import ArchitectureError, ExportError, OptionError
from qwen_onnx.run.machine import peak_rss_mib
from qwen_onnx.run.tflite import (
    DECODE_SIGNATURE,
    describe_signatures,
    prefill_signature,
    require_litert,
)
from qwen_onnx.run.tflite_env import call_with_litert
from qwen_onnx.settings.defaults import TFLITE, TFLITE_QUANTIZATIONS, TFLITE_WEIGHT_ONLY_ROLES
from qwen_onnx.settings.options import check_option
from qwen_onnx.store.artifacts import (
    SIGNATURES_FILE,
    TFLITE_FILE,
    copy_side_files,
    read_json,
    require_hf_checkpoint,
    write_json,
)
from qwen_onnx.store.manifest import verify_manifest
from qwen_onnx.store.provenance import library_versions, package_version
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: ``config.model_type`` values :func:`convert_tflite` converts (Qwen1.5, Qwen2 and Qwen2.5 are
#: ``qwen2``; Qwen3 adds RMSNorm on the query and key heads, as litert-torch's ``qwen3.py`` example).
TFLITE_MODEL_TYPES = ("qwen2", "qwen3")
#: Quantizations asked for by name that litert-torch's generative converter does not offer.
_NOT_OFFERED = {
    "full_int8": "litert-torch's generative converter has no full-integer (int8 activations) recipe",
}


def conversion_rss_gib(params_billion: float,
                       rss_gib_per_billion_params: float = TFLITE["rss_gib_per_billion_params"]) -> float:
    """litert-torch's estimated peak resident set while converting a model, GiB.

    ``params_billion`` x ``rss_gib_per_billion_params``; the default constant, 26 GiB per billion
    parameters, rounds up the peak measured converting Qwen2.5-Coder-0.5B with litert-torch (the model is
    held in fp32 by litert-torch's own layers, exported by ``torch.export`` and lowered, with copies alive at
    once; the measurement in docs/tflite.md).
    """
    return float(params_billion) * float(rss_gib_per_billion_params)


def tflite_skip_reason(model: str, params_billion: float, settings: Mapping[str, Any] | None = None) -> str | None:
    """Why the workflow does not build the tflite variant of ``model``, or None when it does.

    The one decision the workflow (``workflow/rules/common.smk``, which schedules the variant only
    when this returns None) and the report (which prints the returned line) share.

    Args:
        model: the model's short name (it starts the line).
        params_billion: the model's ``params_billion`` from the config.
        settings: the model's ``tflite`` section (``enabled``, ``max_rss_gib``,
            ``rss_gib_per_billion_params``; missing keys take :data:`qwen_onnx.settings.defaults.TFLITE`).

    Returns:
        None when ``enabled`` and :func:`conversion_rss_gib` is at most ``max_rss_gib``; else one
        line, e.g. ``"qwen2.5-coder-1.5b tflite: skipped, litert-torch's conversion would need about
        40 GiB (26 GiB per billion parameters, measured on the 0.5B), above tflite.max_rss_gib = 16"``.
    """
    s = {**TFLITE, **(settings or {})}
    if not s["enabled"]:
        return f"{model} tflite: not built, tflite.enabled is false"
    need = conversion_rss_gib(params_billion, s["rss_gib_per_billion_params"])
    if need <= float(s["max_rss_gib"]):
        return None
    return (f"{model} tflite: skipped, litert-torch's conversion would need about {need:.0f} GiB "
            f"({s['rss_gib_per_billion_params']:g} GiB per billion parameters, measured on the 0.5B), "
            f"above tflite.max_rss_gib = {s['max_rss_gib']:g}")


def check_tflite_options(prefill_length: int, kv_cache_length: int, quantize: str,
                         weight_only_roles: Sequence[str] = ()) -> None:
    """Check the lengths, the quantization name and the weight-only roles before anything is built.

    Raises:
        OptionError: a length not an integer or below 1 (:data:`qwen_onnx.settings.options.RANGES`),
            ``prefill_length > kv_cache_length``, a ``quantize`` not in
            :data:`qwen_onnx.settings.defaults.TFLITE_QUANTIZATIONS`, a role not in
            :data:`~qwen_onnx.settings.defaults.TFLITE_WEIGHT_ONLY_ROLES` (each message names the fix).
    """
    for name, value in (("prefill_length", prefill_length), ("kv_cache_length", kv_cache_length)):
        if value is None:
            raise OptionError(f"tflite {name} is not set; give an integer of at least 1")
        check_option(name, value, key=f"tflite {name}")
    if prefill_length > kv_cache_length:
        raise OptionError(
            f"tflite prefill_length {prefill_length} is longer than kv_cache_length {kv_cache_length}: the "
            f"prefill writes its {prefill_length} positions into the KV cache; give a prefill_length of at "
            f"most {kv_cache_length} or a kv_cache_length of at least {prefill_length}")
    if quantize in _NOT_OFFERED:
        raise OptionError(f"tflite quantize {quantize!r} is not available: {_NOT_OFFERED[quantize]}; give one of "
                          f"{', '.join(TFLITE_QUANTIZATIONS)}")
    if quantize not in TFLITE_QUANTIZATIONS:
        raise OptionError(f"tflite quantize {quantize!r} is unknown; give one of {', '.join(TFLITE_QUANTIZATIONS)}")
    unknown = [r for r in weight_only_roles if r not in TFLITE_WEIGHT_ONLY_ROLES]
    if unknown:
        raise OptionError(f"tflite weight_only_roles {unknown} are not roles it can keep weight-only; give some of "
                          f"{', '.join(TFLITE_WEIGHT_ONLY_ROLES)}, or []")


#: The output-tensor names (regular expressions, ``re.search`` as ai-edge-quantizer applies them) of the FULLY_CONNECTED ops of each
#: weight-only role, as litert-torch 0.10's converter names them: the torch module path, e.g.
#: ``.../TransformerBlock_17/litert_torch.generative.layers.feed_forward.GatedFeedForward_ff/
#: torch.nn.modules.linear.Linear_w2;1``, and ``prefill_256_logits_output`` / ``decode_logits_output``.
_WEIGHT_ONLY_OPS = {
    "down_proj": r".*TransformerBlock_\d+/[^/]*GatedFeedForward_ff/torch\.nn\.modules\.linear\.Linear_w2",
    "lm_head": r".*logits_output",
}


@contextlib.contextmanager
def _weight_only_recipe(weight_only_roles: Sequence[str]) -> Iterator[None]:
    """While open, litert-torch's ``dynamic_int8`` recipe keeps the FULLY_CONNECTED ops of
    ``weight_only_roles`` weight-only INT8 (per-channel INT8 weights dequantized, float compute).

    litert-torch builds its ai-edge-quantizer recipe in
    ``litert_torch.quantize.translate_recipe.translate_to_ai_edge_recipe``, whose per-block
    overrides match ``transformer_blocks[i]``, a name none of the converted ops carries (they carry
    ``TransformerBlock_i``), so a ``GenerativeQuantRecipe`` with ``feedforward`` overrides converts
    unchanged. This replaces that function for the conversion with one that adds, after the default
    dynamic INT8 entry (later entries win in ai-edge-quantizer's ``RecipeManager``), a weight-only
    entry per role on the names of :data:`_WEIGHT_ONLY_OPS`. :func:`count_weight_only_ops` checks
    the result.
    """
    if not weight_only_roles:
        yield
        return
    from litert_torch.generative.quantize import quant_attrs, quant_recipe_utils
    from litert_torch.quantize import translate_recipe

    original = translate_recipe.translate_to_ai_edge_recipe
    weight_only = quant_recipe_utils.create_layer_quant_weight_only(quant_attrs.Dtype.INT8,
                                                                   quant_attrs.Granularity.CHANNELWISE)

    def translate(recipe):
        from ai_edge_quantizer import recipe_manager

        manager = recipe_manager.RecipeManager()
        manager.load_quantization_recipe(original(recipe))
        for role in weight_only_roles:
            translate_recipe._set_quant_config(manager, weight_only, _WEIGHT_ONLY_OPS[role],
                                               translate_recipe._OpName.FULLY_CONNECTED)
        return manager.get_quantization_recipe()

    translate_recipe.translate_to_ai_edge_recipe = translate
    try:
        yield
    finally:
        translate_recipe.translate_to_ai_edge_recipe = original


def count_weight_only_ops(path: str | os.PathLike) -> dict[str, int]:
    """FULLY_CONNECTED ops whose weight comes out of a DEQUANTIZE op (weight-only INT8), per signature.

    Returns:
        ``{signature name: count}`` from the flatbuffer (no interpreter).
    """
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(Path(path).read_bytes(), 0)
    codes = [model.OperatorCodes(i).BuiltinCode() for i in range(model.OperatorCodesLength())]
    counts = {}
    for k in range(model.SignatureDefsLength()):
        signature = model.SignatureDefs(k)
        graph = model.Subgraphs(signature.SubgraphIndex())
        ops = [graph.Operators(i) for i in range(graph.OperatorsLength())]
        dequantized = {op.Outputs(0) for op in ops if codes[op.OpcodeIndex()] == schema.BuiltinOperator.DEQUANTIZE}
        counts[signature.SignatureKey().decode()] = sum(
            1 for op in ops if codes[op.OpcodeIndex()] == schema.BuiltinOperator.FULLY_CONNECTED
            and op.Inputs(1) in dequantized)
    return counts


def _hf_config(hf_dir: Path) -> dict:
    if not (hf_dir / "config.json").is_file():
        require_hf_checkpoint(hf_dir)  # names what the folder holds instead
    return read_json(hf_dir / "config.json")


def check_tflite_config(config: dict, source: str = "config.json") -> None:
    """Refuse a Hugging Face config litert-torch's Qwen layers cannot reproduce.

    Raises:
        ArchitectureError: ``model_type`` not in :data:`TFLITE_MODEL_TYPES`, a ``rope_scaling``, or
            sliding-window attention switched on (the message names the key and the fix).
    """
    model_type = config.get("model_type")
    if model_type not in TFLITE_MODEL_TYPES:
        raise ArchitectureError(
            f"{source}: model_type {model_type!r} cannot be converted to TFLite; the tflite variant converts "
            f"model_type {' or '.join(TFLITE_MODEL_TYPES)} (Qwen1.5, Qwen2, Qwen2.5, Qwen3) only")
    if config.get("rope_scaling"):
        raise ArchitectureError(
            f"{source}: rope_scaling {config['rope_scaling']!r} is not reproduced by litert-torch's rotary "
            "embedding; convert a checkpoint without rope_scaling (or remove the key if it is unused)")
    if config.get("use_sliding_window"):
        raise ArchitectureError(
            f"{source}: use_sliding_window is true; litert-torch's Qwen layers attend globally, so set it to "
            "false (as the Qwen2.5 checkpoints ship) or skip the tflite variant")


def litert_model_config(config: dict, kv_cache_length: int):
    """The ``litert_torch`` ``ModelConfig`` and checkpoint ``TensorNames`` equal to a Qwen2/Qwen3 HF config.

    The per-family settings are those of litert-torch's examples ``qwen/qwen.py`` (Qwen2.5: q/k/v bias)
    and ``qwen/qwen3.py`` (Qwen3: q/k RMSNorm, no bias); the sizes come from ``config``.

    Returns:
        ``(ModelConfig, TensorNames)``.
    """
    import copy

    import litert_torch.generative.layers.model_config as cfg
    from litert_torch.generative.utilities import model_builder

    qwen3 = config["model_type"] == "qwen3"
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=config.get("rms_norm_eps", 1e-6))
    attn = cfg.AttentionConfig(
        num_heads=heads,
        head_dim=head_dim,
        num_query_groups=config.get("num_key_value_heads") or heads,
        rotary_base=config.get("rope_theta", 10000.0),
        rotary_percentage=1.0,
        qkv_use_bias=bool(config.get("attention_bias", False)) if qwen3 else True,
        **(dict(query_norm_config=norm, key_norm_config=norm, qkv_transpose_before_split=True,
                qkv_fused_interleaved=False) if qwen3 else {}),
    )
    ff = cfg.FeedForwardConfig(
        type=cfg.FeedForwardType.GATED,
        activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
        intermediate_size=config["intermediate_size"],
    )
    block = cfg.TransformerBlockConfig(
        attn_config=attn, ff_config=ff, pre_attention_norm_config=norm, post_attention_norm_config=norm
    )
    tied = bool(config.get("tie_word_embeddings", False))
    model_config = cfg.ModelConfig(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        max_seq_len=max(kv_cache_length, config.get("max_position_embeddings", kv_cache_length)),
        embedding_dim=config["hidden_size"],
        block_configs=block,
        final_norm_config=norm,
        lm_head_share_weight_with_embedding=tied,
    )
    names = copy.copy(model_builder.TENSOR_NAMES)
    if qwen3:
        names.attn_query_norm = "model.layers.{}.self_attn.q_norm"
        names.attn_key_norm = "model.layers.{}.self_attn.k_norm"
    if not tied:
        names.lm_head = "lm_head"
    return model_config, names


def convert_tflite(
    hf_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    prefill_length: int = TFLITE["prefill_length"],
    kv_cache_length: int = TFLITE["kv_cache_length"],
    quantize: str = TFLITE["quantize"],
    weight_only_roles: Sequence[str] = TFLITE["weight_only_roles"],
) -> dict:
    """Convert a Qwen Hugging Face folder to ``output_dir/model.tflite`` with a prefill and a decode signature.

    Signatures (tensor names as litert-torch writes them; ``L`` = ``prefill_length``,
    ``K`` = ``kv_cache_length``):

    - ``prefill_<L>``: ``tokens`` int32 [batch=1, L], ``input_pos`` int32 [L],
      ``kv_cache_k_{i}``/``kv_cache_v_{i}`` float32 [1, K, kv_heads, head_dim] ->
      ``logits`` float32 [1, L, vocab] and the updated ``kv_cache_*``;
    - ``decode``: ``tokens`` int32 [1, 1], ``input_pos`` int32 [1], the KV cache ->
      ``logits`` float32 [1, 1, vocab] and the updated KV cache.

    Quantization (litert-torch's ``QuantizationName``): ``dynamic_int8`` (int8 weights, per-channel,
    activations quantized on the fly), ``weight_only_int8``, ``fp16`` (fp16 weights), ``none`` (fp32),
    ``dynamic_int4_block32`` and ``dynamic_int4_block128``. The KV cache and logits stay float32.

    Args:
        hf_dir: Hugging Face folder (config.json, safetensors, tokenizer).
        output_dir: folder to create (replaced if present), written through
            :func:`qwen_onnx.store.staging.staged_dir`.
        prefill_length: tokens of the prefill signature (fixed).
        kv_cache_length: positions of the KV cache (fixed): prompt plus generated tokens.
        quantize: one of :data:`qwen_onnx.settings.defaults.TFLITE_QUANTIZATIONS`.
        weight_only_roles: with ``dynamic_int8`` (the other quantizations ignore it), the roles (``down_proj``, ``lm_head``) whose
            weights stay per-channel INT8 but whose products run in float, without dynamic
            activation quantization (:func:`_weight_only_recipe`). On the 0.5B's spread evaluation
            windows ``dynamic_int8`` alone gave top-1 94.97%, under the gate's 95; with both roles
            weight-only 96.5% (docs/tflite.md).

    Returns:
        The description written to ``output_dir/tflite.json``: ``signatures`` (as
        :func:`describe_signatures`), ``prefill_signature``, ``decode_signature``, ``prefill_length``,
        ``kv_cache_length``, ``quantize``, ``model_type``, ``litert_torch_version``, ``seconds`` (the
        conversion, s), ``peak_rss_mib`` (this process's peak resident set after it, MiB),
        ``tflite_bytes``, ``library_versions``.

    Raises:
        OptionError: bad lengths or quantization (:func:`check_tflite_options`).
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint (the message says what it holds:
            :func:`~qwen_onnx.store.artifacts.require_hf_checkpoint`).
        ArchitectureError: a model litert-torch's Qwen layers do not reproduce (:func:`check_tflite_config`).
        ExportError: litert-torch is not installed here and there is no TFLite environment
            (:func:`qwen_onnx.run.tflite_env.call_with_litert`), or its conversion failed.
        IntegrityError: a file of ``hf_dir`` differs from its manifest.

    Nothing is written when any of these is raised before the conversion starts.
    """
    weight_only_roles = list(weight_only_roles or ())
    check_tflite_options(prefill_length, kv_cache_length, quantize, weight_only_roles)
    if quantize != "dynamic_int8":
        weight_only_roles = []  # the other recipes quantize no activation: nothing to keep float
    hf_dir = Path(hf_dir)
    config = _hf_config(hf_dir)
    check_tflite_config(config, str(hf_dir / "config.json"))
    require_hf_checkpoint(hf_dir)  # an ONNX or TFLite variant folder is named, not handed to litert-torch
    verify_manifest(hf_dir)
    # litert-torch lives in the TFLite environment (.venv-tflite): run there when it is not importable here
    return call_with_litert(_convert, (hf_dir, output_dir, config, prefill_length, kv_cache_length, quantize,
                                       weight_only_roles), converter=True)


def _convert(hf_dir: Path, output_dir: str | os.PathLike, config: dict, prefill_length: int, kv_cache_length: int,
             quantize: str, weight_only_roles: list[str]) -> dict:
    """:func:`convert_tflite` once its checks passed, where litert-torch imports."""
    require_litert()
    from litert_torch.generative.utilities import converter, model_builder
    from litert_torch.generative.utilities.export_config import ExportConfig

    try:
        model_config, names = litert_model_config(config, kv_cache_length)
    except KeyError as exc:
        raise ArchitectureError(f"{hf_dir / 'config.json'} has no {exc.args[0]!r}, which a Qwen config gives; "
                                "give the checkpoint's own config.json") from None
    started = time.time()
    # litert-torch prints its progress on stdout (a rich console); stderr keeps stdout for the CLI's JSON
    with staged_dir(output_dir) as stage, contextlib.redirect_stdout(sys.stderr):
        try:
            model = model_builder.build_decoder_only_model(
                checkpoint_path=str(hf_dir), config=model_config, tensor_names=names,
                mask_cache_size=kv_cache_length)
            with _weight_only_recipe(weight_only_roles):
                written = converter.convert_to_tflite(
                    model, str(stage), "model", prefill_length, kv_cache_length, quantize=quantize,
                    config=model_config, export_config=ExportConfig(output_logits_on_prefill=True))
        except (RuntimeError, ValueError, KeyError, AssertionError) as exc:
            raise ExportError(f"litert-torch failed to convert {hf_dir}: {type(exc).__name__}: {exc}") from exc
        del model
        os.replace(written, stage / TFLITE_FILE)
        seconds = time.time() - started
        weight_only_ops = count_weight_only_ops(stage / TFLITE_FILE) if weight_only_roles else {}
        expected = (model_config.num_layers if "down_proj" in weight_only_roles else 0) + ("lm_head" in weight_only_roles)
        if any(count != expected for count in weight_only_ops.values()):
            raise ExportError(f"the weight-only roles {weight_only_roles} should make {expected} FULLY_CONNECTED ops per "
                              f"signature weight-only; litert-torch's recipe made {weight_only_ops}: its op names changed "
                              "(qwen_onnx.convert.tflite._WEIGHT_ONLY_OPS); set tflite.weight_only_roles: []")
        copy_side_files(hf_dir, stage)
        info: dict[str, Any] = {
            "format": "qwen-onnx tflite 1",
            "tflite_file": TFLITE_FILE,
            "prefill_signature": prefill_signature(prefill_length),
            "decode_signature": DECODE_SIGNATURE,
            "prefill_length": prefill_length,
            "kv_cache_length": kv_cache_length,
            "quantize": quantize,
            "weight_only_roles": weight_only_roles,
            "weight_only_ops": weight_only_ops,
            "model_type": config["model_type"],
            "signatures": describe_signatures(stage / TFLITE_FILE),
            "tflite_bytes": (stage / TFLITE_FILE).stat().st_size,
            "litert_torch_version": package_version("litert-torch"),
            "seconds": round(seconds, 1),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "library_versions": {**library_versions(), "litert-torch": package_version("litert-torch"),
                                 "ai-edge-litert": package_version("ai-edge-litert")},
        }
        write_json(stage / SIGNATURES_FILE, info)
    log.info("wrote %s (%s, prefill %d, KV cache %d) in %.1f s", output_dir, quantize, prefill_length,
             kv_cache_length, seconds)
    return info


# --- reading the flatbuffer (inspection, weight bytes) ---------------------------------------------


