"""What a framework child uses: the child protocol, datasets, weight transfer, numerics helpers."""
