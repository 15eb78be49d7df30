"""A stand-in framework child that fails on purpose (`python -m tests.children.misbehave`: __main__.py says how)."""
