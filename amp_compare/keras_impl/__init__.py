"""The Keras side of amp-compare; one cell: `python -m amp_compare.keras_impl --config … --out … --run-id …`."""
