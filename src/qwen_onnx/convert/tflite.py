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

litert-torch is an optional dependency (``envs/tflite.txt``); this module imports it only inside
the functions that need it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from qwen_onnx.store.artifacts import copy_side_files, library_versions, package_version, read_json, staged_dir, verify_manifest, write_json
from qwen_onnx.settings.defaults import TFLITE, TFLITE_QUANTIZATIONS
from qwen_onnx.errors import ArchitectureError, ArtifactError, ExportError, OptionError

log = logging.getLogger(__name__)

TFLITE_FILE = "model.tflite"
SIGNATURES_FILE = "tflite.json"
DECODE_SIGNATURE = "decode"
#: ``config.model_type`` values :func:`convert_tflite` converts (Qwen1.5, Qwen2 and Qwen2.5 are
#: ``qwen2``; Qwen3 adds RMSNorm on the query and key heads, as litert-torch's ``qwen3.py`` example).
TFLITE_MODEL_TYPES = ("qwen2", "qwen3")
#: Quantizations asked for by name that litert-torch's generative converter does not offer.
_NOT_OFFERED = {
    "full_int8": "litert-torch's generative converter has no full-integer (int8 activations) recipe",
}


def prefill_signature(prefill_length: int) -> str:
    """The name litert-torch gives the prefill signature of one fixed length: ``prefill_<length>``."""
    return f"prefill_{prefill_length}"


def is_tflite_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a tflite variant folder (it holds ``tflite.json``, written last but the manifest).

    Raises:
        ArtifactError: ``folder`` or a folder above it cannot be read by this process (one line
            naming it, its owner and mode, and the fix; :func:`qwen_onnx.store.artifacts.require_readable`).
    """
    from qwen_onnx.store.artifacts import require_readable

    require_readable(folder)
    return (Path(folder) / SIGNATURES_FILE).is_file()


def conversion_rss_gib(params_billion: float,
                       rss_gib_per_billion_params: float = TFLITE["rss_gib_per_billion_params"]) -> float:
    """litert-torch's estimated peak resident set while converting a model, GiB.

    ``params_billion`` x ``rss_gib_per_billion_params``; the default constant, 26 GiB per billion
    parameters, rounds up the peak measured converting Qwen2.5-Coder-0.5B (0.49 B parameters) with
    litert-torch 0.10: 12,871 MiB RSS in 97 s (the workflow's convert_tflite job, commit c20bf2a, 2026-12-02, getrusage; the model is held in fp32 by
    litert-torch's own layers, exported by ``torch.export`` and lowered, with copies alive at once).
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


def check_tflite_options(prefill_length: int, kv_cache_length: int, quantize: str) -> None:
    """Check the lengths and the quantization name before anything is built.

    Raises:
        OptionError: a length not an integer or below 1 (:data:`qwen_onnx.settings.options.RANGES`),
            ``prefill_length > kv_cache_length``, or a ``quantize`` not in
            :data:`qwen_onnx.settings.defaults.TFLITE_QUANTIZATIONS` (the message names the fix).
    """
    from qwen_onnx.settings.options import check_option

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


def _hf_config(hf_dir: Path) -> dict:
    if not (hf_dir / "config.json").is_file():
        raise ArtifactError(f"{hf_dir} has no config.json: give a Hugging Face model folder (run the resolve stage first)")
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


def _require_litert(converter: bool = True) -> None:
    """ai-edge-litert (the interpreter) and, to convert, litert-torch are importable.

    Raises:
        ExportError: one is missing (the message names the install command).
    """
    try:
        import ai_edge_litert.interpreter  # noqa: F401

        if converter:
            import litert_torch  # noqa: F401
    except ImportError as exc:
        raise ExportError(
            f"the tflite variant needs litert-torch and ai-edge-litert ({exc}); install them with "
            "`pip install -r envs/tflite.txt` (envs/setup.sh does)") from exc


#: Named axes of litert-torch's signature tensors, by name (``kv_cache_k_0`` ... by its prefix).
TENSOR_AXES = {
    "tokens": ("batch_size", "sequence_length"),
    "input_pos": ("sequence_length",),
    "logits": ("batch_size", "sequence_length", "vocab"),
    "kv_cache_": ("batch_size", "kv_cache_length", "kv_heads", "head_dim"),
}


def _axes(name: str, rank: int) -> list[str] | None:
    axes = TENSOR_AXES.get(name) or TENSOR_AXES.get("kv_cache_" if name.startswith("kv_cache_") else "")
    return list(axes) if axes and len(axes) == rank else None


def _tensor_table(details: dict) -> dict[str, dict]:
    return {name: {"shape": [int(d) for d in d_["shape"]], "axes": _axes(name, len(d_["shape"])),
                   "dtype": np.dtype(d_["dtype"]).name}
            for name, d_ in sorted(details.items())}


def describe_signatures(tflite_path: str | os.PathLike) -> dict[str, dict]:
    """Every signature of a ``.tflite`` file with its input and output tensors, read by the LiteRT interpreter.

    Returns:
        ``{signature: {"inputs": {name: {"shape": [1, 8], "axes": ["batch_size", "sequence_length"],
        "dtype": "int32"}}, "outputs": {...}}}`` (axes from :data:`TENSOR_AXES`, ``None`` for a
        tensor it does not name).
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tflite_path), num_threads=1)
    table = {}
    for name in interpreter.get_signature_list():
        runner = interpreter.get_signature_runner(name)
        table[name] = {"inputs": _tensor_table(runner.get_input_details()),
                       "outputs": _tensor_table(runner.get_output_details())}
    return table


def convert_tflite(
    hf_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    prefill_length: int = TFLITE["prefill_length"],
    kv_cache_length: int = TFLITE["kv_cache_length"],
    quantize: str = TFLITE["quantize"],
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
            :func:`qwen_onnx.store.artifacts.staged_dir`.
        prefill_length: tokens of the prefill signature (fixed).
        kv_cache_length: positions of the KV cache (fixed): prompt plus generated tokens.
        quantize: one of :data:`qwen_onnx.settings.defaults.TFLITE_QUANTIZATIONS`.

    Returns:
        The description written to ``output_dir/tflite.json``: ``signatures`` (as
        :func:`describe_signatures`), ``prefill_signature``, ``decode_signature``, ``prefill_length``,
        ``kv_cache_length``, ``quantize``, ``model_type``, ``litert_torch_version``, ``seconds`` (the
        conversion, s), ``peak_rss_mib`` (this process's peak resident set after it, MiB),
        ``tflite_bytes``, ``library_versions``.

    Raises:
        OptionError: bad lengths or quantization (:func:`check_tflite_options`).
        ArtifactError: ``hf_dir`` has no config.json.
        ArchitectureError: a model litert-torch's Qwen layers do not reproduce (:func:`check_tflite_config`).
        ExportError: litert-torch is not installed, or its conversion failed.
        IntegrityError: a file of ``hf_dir`` differs from its manifest.

    Nothing is written when any of these is raised before the conversion starts.
    """
    from qwen_onnx.run.machine import peak_rss_mib

    check_tflite_options(prefill_length, kv_cache_length, quantize)
    hf_dir = Path(hf_dir)
    config = _hf_config(hf_dir)
    check_tflite_config(config, str(hf_dir / "config.json"))
    _require_litert()
    verify_manifest(hf_dir)

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
            written = converter.convert_to_tflite(
                model, str(stage), "model", prefill_length, kv_cache_length, quantize=quantize,
                config=model_config, export_config=ExportConfig(output_logits_on_prefill=True))
        except (RuntimeError, ValueError, KeyError, AssertionError) as exc:
            raise ExportError(f"litert-torch failed to convert {hf_dir}: {type(exc).__name__}: {exc}") from exc
        del model
        os.replace(written, stage / TFLITE_FILE)
        seconds = time.time() - started
        copy_side_files(hf_dir, stage)
        info: dict[str, Any] = {
            "format": "qwen-onnx tflite 1",
            "tflite_file": TFLITE_FILE,
            "prefill_signature": prefill_signature(prefill_length),
            "decode_signature": DECODE_SIGNATURE,
            "prefill_length": prefill_length,
            "kv_cache_length": kv_cache_length,
            "quantize": quantize,
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


class TfliteCausalLM:
    """Runs a folder written by :func:`convert_tflite` with the LiteRT interpreter, batch 1.

    Holds the KV cache between calls: :meth:`prefill` starts a sequence at position 0,
    :meth:`decode` extends it one token at a time. ``position`` counts the tokens already in the
    cache; a sequence holds at most ``kv_cache_length`` tokens.

    Args:
        folder: the tflite variant folder (``model.tflite`` + ``tflite.json``).
        threads: the interpreter's ``num_threads`` (CPU threads, as the ONNX sessions' intra-op threads).

    Raises:
        OptionError: ``threads`` below 1.
        ArtifactError: the folder has no ``model.tflite`` or ``tflite.json``.
        IntegrityError: a file differs from the folder's manifest.
        ExportError: ai-edge-litert is not installed.
    """

    def __init__(self, folder: str | os.PathLike, threads: int = 1):
        from qwen_onnx.settings.options import check_option

        folder = Path(folder)
        for name in (TFLITE_FILE, SIGNATURES_FILE):
            if not (folder / name).is_file():
                raise ArtifactError(f"{folder} has no {name}: run `qwen-onnx tflite` to write the folder")
        check_option("threads", threads)
        verify_manifest(folder)
        _require_litert(converter=False)
        from ai_edge_litert.interpreter import Interpreter

        self.folder = folder
        self.info = read_json(folder / SIGNATURES_FILE)
        self.prefill_length: int = self.info["prefill_length"]
        self.kv_cache_length: int = self.info["kv_cache_length"]
        self.threads = threads
        self._interpreter = Interpreter(model_path=str(folder / TFLITE_FILE), num_threads=threads)
        self._prefill = self._interpreter.get_signature_runner(self.info["prefill_signature"])
        self._decode = self._interpreter.get_signature_runner(self.info["decode_signature"])
        inputs = self.info["signatures"][self.info["decode_signature"]]["inputs"]
        self._kv_names = [n for n in inputs if n.startswith("kv_cache_")]
        self._kv_empty = {n: np.zeros(inputs[n]["shape"], dtype=inputs[n]["dtype"]) for n in self._kv_names}
        self.vocab_size: int = self.info["signatures"][self.info["decode_signature"]]["outputs"]["logits"]["shape"][-1]
        self._kv: dict[str, np.ndarray] = dict(self._kv_empty)
        self.position = 0

    def _keep_kv(self, outputs: dict) -> np.ndarray:
        self._kv = {n: outputs[n] for n in self._kv_names}
        return outputs["logits"]

    def prefill(self, ids: Iterable[int]) -> np.ndarray:
        """Start a sequence with the prompt ``ids`` and return the logits of every prompt position.

        Runs the fixed-length prefill signature over chunks of ``prefill_length`` tokens: a short
        last chunk is padded with token 0 at the following positions (their cache rows are
        overwritten by the next decode steps and never attended to before), or, when the prompt is at
        least ``prefill_length`` long, moved back to end at the last token (its overlap recomputes
        cache rows already there from the same context).

        Args:
            ids: prompt token ids, 1 to ``kv_cache_length`` of them.

        Returns:
            float32 [sequence_length, vocab]: logits of every prompt position.

        Raises:
            OptionError: an empty prompt or one longer than ``kv_cache_length``.
        """
        ids = np.asarray(list(ids), dtype=np.int32)
        n, length = len(ids), self.prefill_length
        if not 1 <= n <= self.kv_cache_length:
            raise OptionError(f"a prompt of {n} tokens does not fit this tflite model; give 1 to "
                              f"{self.kv_cache_length} tokens (its kv_cache_length)")
        self._kv = dict(self._kv_empty)
        logits = np.empty((n, self.vocab_size), dtype=np.float32)
        start = 0
        while start < n:
            if start + length > n and n >= length:
                start = n - length
            end = min(start + length, n)
            tokens = np.zeros((1, length), dtype=np.int32)  # [batch=1, prefill_length]
            tokens[0, : end - start] = ids[start:end]
            # [prefill_length]; never past the cache: n < length starts at 0, else the last chunk ends at n
            positions = np.arange(start, start + length, dtype=np.int32)
            out = self._keep_kv(self._prefill(tokens=tokens, input_pos=positions, **self._kv))  # [1, L, vocab]
            logits[start:end] = out[0, : end - start]
            start = end
        self.position = n
        return logits

    def decode(self, token: int, position: int | None = None) -> np.ndarray:
        """Feed one token at ``position`` (default: the next one) and return its logits.

        Returns:
            float32 [vocab]: the logits predicting the token after ``token``.

        Raises:
            OptionError: ``position`` outside 0 to ``kv_cache_length - 1``.
        """
        position = self.position if position is None else position
        if not 0 <= position < self.kv_cache_length:
            raise OptionError(f"decode position {position} is outside the KV cache; this tflite model holds "
                              f"positions 0 to {self.kv_cache_length - 1} (its kv_cache_length)")
        out = self._keep_kv(self._decode(tokens=np.array([[token]], dtype=np.int32),  # [batch=1, 1]
                                         input_pos=np.array([position], dtype=np.int32), **self._kv))
        self.position = position + 1
        return out[0, 0]

    def generate(self, ids: Iterable[int], max_new_tokens: int, eos_token_ids: Iterable[int] = ()) -> list[int]:
        """Greedy generation: the prompt's prefill, then up to ``max_new_tokens`` argmax tokens.

        Stops early at a token of ``eos_token_ids`` (included) or when the KV cache is full.

        Returns:
            The new token ids (without the prompt).
        """
        eos = set(eos_token_ids)
        logits = self.prefill(ids)[-1]
        new: list[int] = []
        while len(new) < max_new_tokens:
            token = int(np.argmax(logits))
            new.append(token)
            if token in eos or self.position >= self.kv_cache_length:
                break
            logits = self.decode(token)
        return new


def read_tflite_info(folder: str | os.PathLike) -> dict:
    """``folder/tflite.json`` (see :func:`convert_tflite`'s return value).

    Raises:
        ArtifactError: the folder has no ``tflite.json``.
    """
    path = Path(folder) / SIGNATURES_FILE
    if not path.is_file():
        raise ArtifactError(f"{folder} has no {SIGNATURES_FILE}: run `qwen-onnx tflite` to write the folder")
    return read_json(path)


# --- reading the flatbuffer (inspection, weight bytes) ---------------------------------------------

#: Ops that read one row of a table per token (the embedding lookup).
_LOOKUP_OPS = ("EMBEDDING_LOOKUP", "GATHER")


def _enum_names(enum_class) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


def read_tflite_graph(tflite_path: str | os.PathLike) -> dict[str, Any]:
    """The structure of a ``.tflite`` file read from its flatbuffer (memory-mapped; no interpreter, no tensors allocated).

    Uses the LiteRT flatbuffer schema shipped with ai-edge-litert (``ai_edge_litert.schema_py_generated``).

    Returns:
        ``subgraphs``: per signature (its key, else ``subgraph_<i>``) ``ops`` (op-type histogram, most
        common first) and ``nodes`` (operator count); ``constant_tensors`` (distinct weight buffers),
        ``constant_bytes`` and ``constant_bytes_per_dtype`` (bytes of those buffers by tensor type,
        e.g. ``{"int8": 311296, "float32": 1024}``), ``constant_tensors_per_dtype`` (their count); ``embedding`` (the table an ``EMBEDDING_LOOKUP``
        or ``GATHER`` reads: ``shape`` [vocab, hidden], ``dtype``, ``bytes``, ``row_bytes``, and
        ``shared`` when another op, the tied lm_head, reads the same buffer), or None when no such table is found.

    Raises:
        ArtifactError: the file is missing or not a TFLite flatbuffer.
    """
    import mmap

    from ai_edge_litert import schema_py_generated as schema

    path = Path(tflite_path)
    if not path.is_file():
        raise ArtifactError(f"no TFLite file at {path}: run `qwen-onnx tflite` to write the folder")
    op_names = _enum_names(schema.BuiltinOperator)
    type_names = {k: v.lower() for k, v in _enum_names(schema.TensorType).items()}
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[4:8] != b"TFL3":
            raise ArtifactError(f"{path} is not a TFLite flatbuffer (no TFL3 identifier); delete the folder and "
                                "rerun the stage that wrote it")
        model = schema.Model.GetRootAs(data, 0)
        codes = []
        for i in range(model.OperatorCodesLength()):
            code = model.OperatorCodes(i)
            codes.append(op_names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM"))

        def buffer_bytes(index: int) -> int:
            buffer = model.Buffers(index)
            return int(buffer.Size()) if buffer.Offset() > 1 else int(buffer.DataLength())

        names = {model.SignatureDefs(i).SubgraphIndex(): model.SignatureDefs(i).SignatureKey().decode()
                 for i in range(model.SignatureDefsLength())}
        subgraphs: dict[str, dict[str, Any]] = {}
        constant: dict[int, str] = {}  # buffer -> tensor type
        readers: dict[int, set[str]] = {}  # constant buffer -> op types reading it
        lookup: dict[int, tuple[list[int], str]] = {}  # table buffer -> (shape, dtype)
        for g in range(model.SubgraphsLength()):
            graph = model.Subgraphs(g)
            tensors = [graph.Tensors(t) for t in range(graph.TensorsLength())]
            for tensor in tensors:
                if tensor.Buffer() > 0 and buffer_bytes(tensor.Buffer()) > 0:
                    constant[tensor.Buffer()] = type_names.get(tensor.Type(), str(tensor.Type()))
            ops = []
            for o in range(graph.OperatorsLength()):
                op = graph.Operators(o)
                name = codes[op.OpcodeIndex()]
                ops.append(name)
                inputs = [int(i) for i in op.InputsAsNumpy()] if op.InputsLength() else []
                for position, index in enumerate(inputs):
                    if index < 0 or tensors[index].Buffer() not in constant:
                        continue
                    buffer = tensors[index].Buffer()
                    readers.setdefault(buffer, set()).add(name)
                    if name in _LOOKUP_OPS and tensors[index].ShapeLength() == 2 and \
                            (name == "GATHER" and position == 0 or name == "EMBEDDING_LOOKUP" and position == 1):
                        lookup[buffer] = ([int(d) for d in tensors[index].ShapeAsNumpy()], constant[buffer])
            histogram = {}
            for name in sorted(set(ops), key=lambda n: (-ops.count(n), n)):
                histogram[name] = ops.count(name)
            subgraphs[names.get(g, f"subgraph_{g}")] = {"nodes": len(ops), "ops": histogram}
        per_dtype: dict[str, int] = {}
        count_per_dtype: dict[str, int] = {}
        for buffer, dtype in constant.items():
            per_dtype[dtype] = per_dtype.get(dtype, 0) + buffer_bytes(buffer)
            count_per_dtype[dtype] = count_per_dtype.get(dtype, 0) + 1
        embedding = None
        if lookup:
            buffer, (shape, dtype) = max(lookup.items(), key=lambda item: buffer_bytes(item[0]))
            size = buffer_bytes(buffer)
            embedding = {"shape": shape, "dtype": dtype, "bytes": size, "row_bytes": size // max(shape[0], 1),
                         "shared": bool(readers[buffer] - set(_LOOKUP_OPS))}
        return {"subgraphs": subgraphs, "constant_tensors": len(constant), "constant_bytes": sum(per_dtype.values()),
                "constant_bytes_per_dtype": dict(sorted(per_dtype.items(), key=lambda kv: -kv[1])),
                "constant_tensors_per_dtype": dict(sorted(count_per_dtype.items(), key=lambda kv: -kv[1])),
                "embedding": embedding}


def tflite_weight_bytes_per_token(folder: str | os.PathLike) -> tuple[int, str]:
    """Bytes read to decode one token from a tflite folder, and how they were counted.

    The ``model.tflite`` bytes minus its embedding table plus one row of it (a lookup reads one
    row per token), as :func:`qwen_onnx.measure.inspect_graph.decode_weight_bytes` counts ONNX graphs; the
    whole file when the table is not found or is also the (tied) lm_head's weight, which reads all of it.

    Returns:
        ``(bytes, note)``.
    """
    path = Path(folder) / TFLITE_FILE
    total = path.stat().st_size
    embedding = read_tflite_graph(path)["embedding"]
    if embedding is None:
        return total, "the model.tflite bytes (no embedding lookup table found)"
    if embedding["shared"]:
        return total, "the model.tflite bytes (the embedding table is also the tied lm_head's weight)"
    return (total - embedding["bytes"] + embedding["row_bytes"],
            f"the model.tflite bytes minus the {embedding['dtype']} embedding table {embedding['shape']} "
            f"({embedding['bytes']} bytes) plus one row")


def inspect_tflite(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``inspect`` stage's summary of a tflite folder (the ONNX variants' is :func:`qwen_onnx.measure.inspect_graph.inspect_model`).

    Returns:
        ``format`` (``tflite``), ``path``; ``signatures`` as ``tflite.json`` records them (per
        signature its input and output tensors with ``shape``, ``dtype`` and named ``axes``, e.g.
        ``logits`` float32 [batch_size=1, sequence_length, vocab]); ``prefill_length``,
        ``kv_cache_length`` (tokens), ``quantize`` (the litert-torch recipe); ``subgraphs`` (per
        signature, op-type histogram and operator count), ``other_subgraphs`` (the composite ops'
        decompositions), ``nodes`` (the prefill signature's operator count) and ``op_types`` (its
        histogram); ``quant_ops`` (``{"int8 weights": count}``: weight buffers stored int8, int4 or float16), ``initializers`` (``count``,
        ``bytes``, ``bytes_per_dtype`` of the weight buffers); ``embedding`` (see
        :func:`read_tflite_graph`); ``bytes_on_disk`` (``model.tflite``, bytes); ``opsets`` ({}: a
        TFLite file has none); ``litert_torch_version``.

    Raises:
        ArtifactError: the folder has no ``tflite.json`` or ``model.tflite``.
    """
    folder = Path(folder)
    info = read_tflite_info(folder)
    graph = read_tflite_graph(folder / TFLITE_FILE)
    prefill = graph["subgraphs"].get(info["prefill_signature"]) or next(iter(graph["subgraphs"].values()))
    quantized = {dtype: n for dtype, n in graph["constant_tensors_per_dtype"].items() if dtype in ("int8", "int4", "float16")}
    signatures = {name: ops for name, ops in graph["subgraphs"].items() if name in info["signatures"]}
    return {
        "format": "tflite",
        "path": str(folder / TFLITE_FILE),
        "quantize": info["quantize"],
        "prefill_length": info["prefill_length"],
        "kv_cache_length": info["kv_cache_length"],
        "signatures": info["signatures"],
        "subgraphs": signatures,
        "other_subgraphs": len(graph["subgraphs"]) - len(signatures),  # decompositions of composite ops (RMSNorm, SDPA)
        "nodes": prefill["nodes"],
        "op_types": prefill["ops"],
        "quant_ops": {f"{dtype} weights": n for dtype, n in quantized.items()},
        "initializers": {"count": graph["constant_tensors"], "bytes": graph["constant_bytes"],
                         "bytes_per_dtype": graph["constant_bytes_per_dtype"]},
        "embedding": graph["embedding"],
        "bytes_on_disk": (folder / TFLITE_FILE).stat().st_size,
        "opsets": {},
        "litert_torch_version": info.get("litert_torch_version"),
    }


def inspect_tflite_markdown(info: Mapping[str, Any]) -> str:
    """:func:`inspect_tflite`'s summary as Markdown: the signatures' tensors, the ops, the bytes."""
    lines = [f"# {info['path']}", "",
             f"LiteRT (TFLite) through litert-torch {info.get('litert_torch_version')}; quantization "
             f"`{info['quantize']}`; prefill {info['prefill_length']} tokens, KV cache {info['kv_cache_length']} "
             f"positions; {info['bytes_on_disk']:,} bytes on disk, weight buffers "
             + ", ".join(f"{d} {b:,} bytes" for d, b in info["initializers"]["bytes_per_dtype"].items()) + ".", ""]
    for name, signature in info["signatures"].items():
        lines += [f"## Signature `{name}`", "", "| | tensor | dtype | shape | axes |", "|---|---|---|---|---|"]
        for side in ("inputs", "outputs"):
            for tensor, d in signature[side].items():
                lines.append(f"| {side[:-1]} | `{tensor}` | {d['dtype']} | {d['shape']} | "
                             f"{', '.join(d['axes']) if d.get('axes') else '–'} |")
        ops = info["subgraphs"].get(name, {})
        if ops:
            lines += ["", f"{ops['nodes']} operators: " + ", ".join(f"{k} {v}" for k, v in ops["ops"].items())]
        lines.append("")
    return "\n".join(lines)
