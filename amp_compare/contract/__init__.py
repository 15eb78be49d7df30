"""What both process sides share: the run configuration, records, atomic writes, the environment."""
