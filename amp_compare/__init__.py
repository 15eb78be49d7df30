"""amp-compare: mixed-precision training measured side by side in PyTorch and Keras.

The package is sorted by process side (docs/ARCHITECTURE.md):
  contract/    what both sides share: RunConfig and its options, records, atomic writes, environment
  harness/     the parent process only: CLI, planning, runner, report (never imported by a child)
  kit/         what every framework child uses: the child protocol, data, weights, numerics helpers
  torch_impl/  the PyTorch child;  keras_impl/  the Keras child
"""
