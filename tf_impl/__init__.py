"""tf side of amp-compare; run one cell with `python -m tf_impl --config … --out … --run-id …`."""
