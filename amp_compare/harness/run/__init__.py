"""The parent's running side: the command line, planning and running the matrix in child processes."""
