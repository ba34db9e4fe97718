"""Bridges from other libraries to cute_fa's kernels.

Each submodule imports its library only when it is itself imported:
`import cute_fa.integrations.transformers` registers the "cute_fa" attention backend of
HF transformers.
"""
