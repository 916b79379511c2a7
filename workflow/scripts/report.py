"""Snakemake wrapper: the combined report (report.md, report.html, metrics.csv/json, plots)."""
from pathlib import Path

from qwen_onnx.report.build import build_report
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    inp, out = snakemake.input, snakemake.output
    build_report(
        snakemake.params.models,
        snakemake.params.variants,
        {
            "inspect": inp.inspect,
            "accuracy": inp.accuracy,
            "latency": inp.latency,
            "pytorch": inp.pytorch,
            "diff": inp.diff,
            "sensitivity": inp.sensitivity,
            "peers": inp.peers,
            "task": inp.task,
        },
        inp.machine,
        prompt_lengths=snakemake.params.prompt_lengths,
        tflite=snakemake.params.tflite,
        task_notes=snakemake.params.task_notes,  # an earlier `task` run's results that are no longer current  # which models have a tflite variant, and why not (qwen_onnx.convert.tflite.tflite_skip_reason)
        results_dir=Path(out.json).parent,  # metrics.json is at the results folder's top
        pipeline_csv=out.pipeline,
        markdown=out.markdown,
        html_path=out.html,
        csv_path=out.csv,
        json_path=out.json,
        plots={"ppl_vs_size": out.ppl_vs_size, "decode_tok_s": out.decode_tok_s, "prefill_latency": out.prefill_latency,
               "accuracy_vs_speed": out.accuracy_vs_speed},
    )
