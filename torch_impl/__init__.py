"""torch side of amp-compare; run one cell with `python -m torch_impl --config … --out … --run-id …`."""
