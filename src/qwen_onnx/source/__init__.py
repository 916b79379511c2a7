"""Sources: a model ID, local folder, GGUF file or embedded GGUF parts resolved to an fp32 Hugging Face folder,
and the calibration and evaluation text.
"""
