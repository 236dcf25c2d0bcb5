"""treeduce: in-network allreduce from Python.

`import treeduce.torch` registers the torch.distributed backend "treeduce" (docs/pytorch.md).
"""

__all__ = ["torch"]
