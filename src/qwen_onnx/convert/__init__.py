"""Conversions that keep float weights: the ONNX export routes, the fused (GroupQueryAttention) graph, fp16,
LiteRT (TFLite), and onnxruntime-genai's configuration and builder.
"""
