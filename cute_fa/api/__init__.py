"""The public API: the entry points (`forward`, `backward`), the argument rules they share
(`checks`), autograd for eager calls (`autograd`), the custom ops torch.compile traces (`ops`,
and `graph_mods` for calls with mods or sinks) and `precompile`. `cute_fa` itself re-exports
the public functions."""
