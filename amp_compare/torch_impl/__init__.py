"""The PyTorch side of amp-compare; one cell: `python -m amp_compare.torch_impl --config … --out … --run-id …`."""
