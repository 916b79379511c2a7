"""Snakemake wrapper: optimum-intel's INT4 OpenVINO IR of one model (OpenVINO's own route, a peer of the timing
sitting), exported by the interpreter of its own environment; a failed export (or a missing environment) is
recorded and the sitting reports the row as skipped with the reason."""
from qwen_onnx.convert.openvino_export import export_openvino_int4
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    export_openvino_int4(
        snakemake.input.hf,
        snakemake.output.model_dir,
        python=snakemake.params.python,
        keep_failure=True,
    )
