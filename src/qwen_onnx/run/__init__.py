"""Running a graph: the ONNX decode loop and its session settings, the LiteRT interpreter, and the machine they
run on (CPU flags, ISA, integer kernel path, load). Measures nothing.
"""
