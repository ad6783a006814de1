"""Tensor parallelism's process group and collectives (the parallel layers live with the
models, the rank workers with the engine)."""
