"""Storage: a variant folder's files, written through a staged folder with a manifest, external data,
provenance, and reading folders in the Hugging Face cache layout. The bottom layer: imports no other layer.
"""
