"""Quantization: INT8 dynamic, static and mixed, int4 (k-quant, MatMulNBits), quantized embeddings, calibration
and the transforms (Hadamard rotation, SmoothQuant, outlier split), and the per-MatMul sensitivity that
chooses what stays float.
"""
