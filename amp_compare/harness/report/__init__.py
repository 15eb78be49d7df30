"""Everything that reads a run's records and renders them; it never imports harness.run."""
