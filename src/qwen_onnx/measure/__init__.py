"""Measurement: the PyTorch reference, accuracy and parity against it, the timing sitting and its protocol,
profiling, graph inspection.
"""
