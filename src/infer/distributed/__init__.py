"""Tensor parallelism: the ranks' process group, column/row-parallel layers, rank workers."""
